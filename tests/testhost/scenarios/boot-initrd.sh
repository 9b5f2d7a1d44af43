# The same rootfs as an initramfs (no disk): kernel + serial + boot timer + ACPI power-off
# (S5) -> exit 0.
vm initrd --kernel "$VMLINUX" --initrd "$INITRD" --mem-mib 256 \
	--cmdline "microvirt.scenario=boot"
