# The stock guest's init loads Debian's button and evdev modules and waits for KEY_POWER from the
# kernel's "Power Button" input device; the test host presses microvm's ACPI power button
# (GED interrupt -> _EVT -> Notify(PWRB, 0x80)); the init powers off -> microvm exits 0.
VM_TIMEOUT=600
cp "$STOCK_DISK" root.img
vm button --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 512 \
	--disk path=root.img --control-socket "$WORK/ctl.sock" \
	--cmdline "root=/dev/vda1 ro quiet microvirt.scenario=power-button" &
i=0
until grep -q "microvirt: power-button waiting" "$WORK/button.log" 2>/dev/null; do
	i=$((i + 1))
	[ $i -ge 3000 ] && break
	grep -q "microvirt: poweroff" "$WORK/button.log" 2>/dev/null && break
	sleep 0.2
done
echo "check press $(cut -d' ' -f1 /proc/uptime)"
"$MICROVM" control "$WORK/ctl.sock" '{"cmd":"power-button"}' 2>&1 | sed 's/^/check control /'
wait
