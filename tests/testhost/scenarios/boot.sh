# Linux reaches /init with its root on virtio-blk (ELF vmlinux, PVH); reboot -> microvm exits 0.
cp "$ROOTFS" root.ext4
vm boot --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw microvirt.scenario=boot"
