# The virtio-rng device (--rng) becomes the Linux guest's hardware RNG: /dev/hwrng reads from it.
cp "$ROOTFS" root.ext4
vm rng --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 --rng \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=rng"
