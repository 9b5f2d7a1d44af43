# The VM generation ID seen by the stock Debian guest: boot it (its init's vmgenid scenario reads
# the 16-byte ID at 0xff000, where microvm's DSDT VGEN.ADDR points, and prints it whenever it
# changes), snapshot it through the control socket while that loop runs, stop it, and restore
# the snapshot twice: each restored guest prints the ID it now sees.
VM_TIMEOUT=600
CMD="root=/dev/vda1 ro quiet microvirt.scenario=vmgenid microvirt.vmgenid=0xff000"
# wait_line LOG TEXT [SKIP]: until LOG has more than SKIP lines with TEXT (or the VM ended).
wait_line() {
	until [ "$(grep -c "$2" "$WORK/$1.log" 2>/dev/null)" -gt "${3:-0}" ]; do
		[ -e "$WORK/$1.rc" ] && { echo "check $1 ended before: $2"; return 1; }
		sleep 0.2
	done
}
vm gen --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 256 \
	--disk "path=$STOCK_DISK,overlay=$WORK/o0.ovl" --control-socket "$WORK/gen.sock" \
	--cmdline "$CMD" &
wait_line gen "microvirt: vmgenid-waiting"
"$MICROVM" control "$WORK/gen.sock" "{\"cmd\":\"snapshot\",\"dir\":\"$WORK/snap\"}" 2>&1 |
	sed 's/^/check snapshot /'
"$MICROVM" control "$WORK/gen.sock" '{"cmd":"stop"}' > /dev/null 2>&1
wait
for r in 1 2; do
	vm "r$r" --restore "$WORK/snap" --disk "path=$STOCK_DISK,overlay=$WORK/o$r.ovl" \
		--control-socket "$WORK/r$r.sock" &
	# The restored guest's loop prints the ID once it differs from the one it had.
	wait_line "r$r" "microvirt: vmgenid "
	"$MICROVM" control "$WORK/r$r.sock" '{"cmd":"stop"}' > /dev/null 2>&1
	wait
done
