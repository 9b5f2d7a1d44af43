# SIGTERM to microvm → Ctrl-Alt-Del through the i8042 → the guest's init syncs and reboots → exit 0.
cp "$ROOTFS" root.ext4
vm shutdown --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=wait-shutdown" &
i=0
until grep -q "microvirt: waiting for shutdown" "$WORK/shutdown.log" 2>/dev/null; do
	i=$((i + 1))
	[ $i -ge 600 ] && break
	sleep 0.2
done
echo "check sigterm $(cut -d' ' -f1 /proc/uptime)"
kill -TERM $(pidof microvm)
wait
