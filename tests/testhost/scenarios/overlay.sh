# An overlay disk takes the guest's writes and leaves its base image unchanged.
cp "$ROOTFS" base.ext4
t=$(token)
echo "check token $t"
echo "check base-before $(sha base.ext4)"
vm overlay --kernel "$VMLINUX" --mem-mib 256 --disk "path=base.ext4,overlay=$WORK/overlay.img" \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=overlay-write microvirt.token=$t"
echo "check base-after $(sha base.ext4)"
