# Shared by every scenario script (busybox sh). Environment: MICROVM VMLINUX BZIMAGE ROOTFS INITRD WORK.
# Lines the Rust tests parse start with "check " (from here) or "microvirt: " (from the guest).

# vm NAME [microvm args...]: runs microvm under a timeout, streams its console prefixed with
# [NAME], keeps it in $WORK/NAME.log and prints "vm NAME exit=RC".
vm() {
	_n=$1
	shift
	: > "$WORK/$_n.log"
	echo "check vm $_n start $(cat /proc/uptime | cut -d' ' -f1)"
	{ timeout "${VM_TIMEOUT:-120}" "$MICROVM" "$@" 2>&1; echo "$?" > "$WORK/$_n.rc"; } |
		while IFS= read -r _l; do
			echo "[$_n] $_l"
			echo "$_l" >> "$WORK/$_n.log"
		done
	_rc=$(cat "$WORK/$_n.rc" 2>/dev/null || echo missing)
	echo "check vm $_n exit=$_rc end $(cat /proc/uptime | cut -d' ' -f1)"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

token() { echo "tok$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"; }
