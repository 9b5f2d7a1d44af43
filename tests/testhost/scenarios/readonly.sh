# A read-only disk (/dev/vdb) refuses writes and is unchanged afterwards.
cp "$ROOTFS" root.ext4
cp "$ROOTFS" data.ext4
echo "check data-before $(sha data.ext4)"
vm ro --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 --disk path=data.ext4,ro \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=disk-ro"
echo "check data-after $(sha data.ext4)"
