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

# _vm_watch NAME SOCKET: when the VM still runs STALL_DUMP seconds (default: two thirds of
# VM_TIMEOUT) of test-host uptime after it started, prints its vCPUs' state twice, 10 s apart, as
# "check vm NAME vcpu-state JSON" (registers, LAPIC timer, pending vectors, IOAPIC pins): a hang
# leaves its evidence in the log of the run that then times out. The deadline is read from
# /proc/uptime, not counted in loop turns (a busy test host makes each turn much longer than 1 s);
# the query itself is bounded, so a VMM that cannot pause its vCPUs says so.
_vm_watch() {
	_t0=$(cut -d. -f1 /proc/uptime)
	_limit=${STALL_DUMP:-$((${VM_TIMEOUT:-120} * 2 / 3))}
	until [ $(($(cut -d. -f1 /proc/uptime) - _t0)) -ge "$_limit" ]; do
		# Done: the VM ended, or its scenario did and removed the work dir.
		[ -e "$WORK/$1.rc" ] || [ ! -d "$WORK" ] && return 0
		sleep 1
	done
	for _k in 1 2; do
		[ -e "$WORK/$1.rc" ] || [ ! -d "$WORK" ] && return 0
		case "$MICROVM" in
		*virt-launcher) _s=$(timeout 30 "$MICROVM" vcpu-state --socket "$2" 2>&1) ;;
		*) _s=$(timeout 30 "$MICROVM" control "$2" '{"cmd":"vcpu-state"}' 2>&1) ;;
		esac
		_r=$?
		[ $_r = 143 ] && _s="no answer in 30 s (the VMM did not pause its vCPUs) $_s"
		echo "check vm $1 vcpu-state after $(($(cut -d. -f1 /proc/uptime) - _t0)) s: $_s"
		sleep 10
	done
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

token() { echo "tok$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"; }
