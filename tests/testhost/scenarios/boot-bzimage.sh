# Same as boot, with the bzImage of the same kernel.
cp "$ROOTFS" root.ext4
vm bzimage --kernel "$BZIMAGE" --mem-mib 256 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=boot"
