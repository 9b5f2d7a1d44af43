# Linux reaches /init with its root on virtio-blk (ELF vmlinux, PVH), finds its devices through
# ACPI; the init ends with a reboot (`microvirt.end=reboot`: the i8042 reset line) -> exit 0.
cp "$ROOTFS" root.ext4
vm boot --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw microvirt.scenario=boot microvirt.end=reboot"
