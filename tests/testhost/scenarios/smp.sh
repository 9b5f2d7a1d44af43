# --vcpus 2: the guest sees 2 CPUs.
cp "$ROOTFS" root.ext4
vm smp --kernel "$VMLINUX" --mem-mib 256 --vcpus 2 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=smp"
