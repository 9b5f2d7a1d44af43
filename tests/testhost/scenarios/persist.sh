# A file written and synced in one boot is there in the next boot.
cp "$ROOTFS" root.ext4
t=$(token)
echo "check token $t"
vm write --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=disk-write microvirt.token=$t"
vm read --kernel "$VMLINUX" --mem-mib 256 --disk path=root.ext4 \
	--cmdline "root=/dev/vda rw quiet microvirt.scenario=disk-read"
