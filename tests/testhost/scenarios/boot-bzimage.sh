# Same as boot, with the bzImage of the same kernel, ending with the init's ACPI power-off.
cp "$ROOTFS" root.ext4
vm bzimage --kernel "$BZIMAGE" --mem-mib 256 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=boot"
