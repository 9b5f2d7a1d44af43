# SIGTERM to microvm asks the guest to shut down: with ACPI, the power button (the kernel's tiny
# power-button driver signals init, which powers off through S5); with `acpi=off`, Ctrl-Alt-Del
# through the i8042 (init gets SIGINT and reboots). Both end with exit 0.
cp "$ROOTFS" root.ext4
for v in shutdown:"" shutdown-noacpi:" acpi=off"; do
	name=${v%%:*}
	vm "$name" --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
		--cmdline "root=/dev/vda rw quiet microvirt.scenario=wait-shutdown${v#*:}" &
	wait_line "$WORK/$name.log" "microvirt: waiting for shutdown" 600
	echo "check sigterm $name $(cut -d' ' -f1 /proc/uptime)"
	kill -TERM $(pidof microvm)
	wait
done
