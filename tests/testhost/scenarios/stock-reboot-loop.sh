# Debian's stock kernel rebooting in place again and again in one microvm process
# (`--reboot in-place`, the init's reboot-loop scenario: `microvirt.reboots=` reboots, then an
# ACPI power-off). Not in the suite: `cargo xtask testhost stock-reboot-loop` (a soak of the
# in-place reboot with a real kernel; the suite's one in-place reboot of a stock kernel is the
# launcher's cloud-image test). `nokaslr`: a hang's RIP can be looked up in System.map.
VM_TIMEOUT=1500
cp "$STOCK_DISK" root.img
vm loop --kernel "$STOCK_VMLINUZ" --initrd "$STOCK_INITRD" --mem-mib 512 --vcpus 2 \
	--disk path=root.img --reboot in-place \
	--cmdline "root=/dev/vda1 ro nokaslr microvirt.scenario=reboot-loop microvirt.reboots=${STOCK_REBOOTS:-6}"
