# Shared by every scenario script (busybox sh). Environment: MICROVM VMLINUX BZIMAGE ROOTFS INITRD WORK.
# Lines the Rust tests parse start with "check " (from here) or "microvirt: " (from the guest).

# vm NAME [microvm args...]: runs microvm under a timeout, streams its console prefixed with
# [NAME], keeps it in $WORK/NAME.log and prints "vm NAME exit=RC". A VM given no
# `--control-socket` gets $WORK/NAME.ctl, for the stall watch below.
vm() {
	_n=$1
	shift
	: > "$WORK/$_n.log"
	rm -f "$WORK/$_n.rc"
	_sock=
	_prev=
	for _a in "$@"; do
		[ "$_prev" = --control-socket ] && _sock=$_a
		_prev=$_a
	done
	if [ -z "$_sock" ]; then
		_sock="$WORK/$_n.ctl"
		set -- "$@" --control-socket "$_sock"
	fi
	echo "check vm $_n start $(cat /proc/uptime | cut -d' ' -f1)"
	_vm_watch "$_n" "$_sock" &
	{ timeout "${VM_TIMEOUT:-120}" "$MICROVM" "$@" 2>&1; echo "$?" > "$WORK/$_n.rc"; } |
		while IFS= read -r _l; do
			echo "[$_n] $_l"
			echo "$_l" >> "$WORK/$_n.log"
		done
	_rc=$(cat "$WORK/$_n.rc" 2>/dev/null || echo missing)
	echo "check vm $_n exit=$_rc end $(cat /proc/uptime | cut -d' ' -f1)"
}

# _vm_watch NAME SOCKET: when the VM still runs after STALL_DUMP seconds (default: two thirds
# of VM_TIMEOUT), prints its vCPUs' state twice, 10 s apart, as "check vm NAME vcpu-state JSON"
# (registers, LAPIC timer, pending vectors, IOAPIC pins): a hang leaves its evidence in the log
# of the run that then times out.
_vm_watch() {
	_w=0
	_limit=${STALL_DUMP:-$((${VM_TIMEOUT:-120} * 2 / 3))}
	while [ $_w -lt "$_limit" ]; do
		[ -e "$WORK/$1.rc" ] && return 0
		sleep 1
		_w=$((_w + 1))
	done
	for _k in 1 2; do
		[ -e "$WORK/$1.rc" ] && return 0
		case "$MICROVM" in
		*virt-launcher) _s=$("$MICROVM" vcpu-state --socket "$2" 2>&1) ;;
		*) _s=$("$MICROVM" control "$2" '{"cmd":"vcpu-state"}' 2>&1) ;;
		esac
		echo "check vm $1 vcpu-state after $((_w + (_k - 1) * 10)) s: $_s"
		sleep 10
	done
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

token() { echo "tok$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"; }
