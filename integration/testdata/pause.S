# The CRI suite's sandbox image's /pause (integration/crisuite_test.go holds
# the binary, base64): sleeps until SIGTERM or SIGINT, then exits 0, as
# registry.k8s.io/pause does. No libc, 440 bytes, so that an image volume of
# the sandbox image is small enough for cryo to copy into the guest.
# Rebuild: as -o pause.o pause.S && ld -static -n -s -o pause pause.o && base64 -w 76 pause
	.globl _start
	.text
_start:
	mov $13, %eax            # rt_sigaction(SIGTERM, &act, NULL, 8)
	mov $15, %edi
	lea act(%rip), %rsi
	xor %edx, %edx
	mov $8, %r10d
	syscall
	mov $13, %eax            # rt_sigaction(SIGINT, &act, NULL, 8)
	mov $2, %edi
	lea act(%rip), %rsi
	xor %edx, %edx
	mov $8, %r10d
	syscall
1:	mov $34, %eax            # pause()
	syscall
	jmp 1b
handler:
	mov $231, %eax           # exit_group(0)
	xor %edi, %edi
	syscall

	.balign 8
# x86-64 delivers a signal only to a handler with SA_RESTORER; the
# handler never returns, so the restorer is never used.
act:	.quad handler, 0x04000000, handler, 0   # sa_handler, sa_flags, sa_restorer, sa_mask
