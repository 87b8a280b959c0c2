// Package devstate reads QEMU 7.2's migration stream (the "device state" a
// checkpoint saves) and splits one RAM block's pages out of it.
//
// Why: a shared clone maps its snapshot's RAM privately (memory-backend-file
// share=off), so x-ignore-shared no longer keeps that block out of the
// stream and a checkpoint of the clone streams its whole RAM. Split copies
// the stream without the block's page records and hands the pages to the
// caller, who compares them with the base. The output is then a device
// state like any other checkpoint's: migrate-incoming loads it into a QEMU
// whose RAM is a share=on file, with x-ignore-shared on.
//
// The stream, as QEMU 7.2 writes it for a stopped VM's precopy migration
// (migration/savevm.c, migration/ram.c):
//
//	"QEVM" be32(3)
//	0x07 configuration: be32 len, machine name, subsections
//	     (0x05 u8 len name be32 version, fields): target-page-bits,
//	     capabilities (x-ignore-shared, the only validated one), uuid
//	0x01 START be32 id, u8 len "ram", be32 instance 0, be32 version 4
//	     be64 total|MEM_SIZE, per block: u8 len idstr, be64 used_length
//	     [be64 guest address with x-ignore-shared], be64 EOS
//	     0x7e be32 id (footer)
//	0x02 PART / 0x03 END be32 id: page records, be64 EOS, footer
//	     a record: be64 offset|flags, [u8 len idstr unless CONTINUE],
//	     then 4096 bytes (PAGE) or one fill byte (ZERO)
//	0x04 FULL sections of the devices, 0x00 EOF, 0x06 vmdesc JSON
//
// Everything after ram's END section is copied verbatim: the devices'
// sections have no generic syntax. Nothing RAM-related follows it (the
// iterable sections end before the non-iterable ones are written), and a
// page of the split block hidden there by a hostile QEMU could not be
// loaded anyway: the destination ignores the block (share=on with
// x-ignore-shared) and refuses any page of it ("should not be migrated").
//
// The traps:
//   - CONTINUE means "the block of the previous record", across sections
//     (the loader's last_recv_block). Removing one block's records keeps
//     the others' valid as they are: a record after a removed one is
//     either the removed block's too or named.
//   - The block list's format depends on the capabilities the
//     configuration announced (the guest address with x-ignore-shared), and
//     on postcopy (a page size), which the stream does not announce: a
//     postcopy stream is refused by its ADVISE command before ram's START.
//   - QEMU 7.2 only sends all-zero pages as fills (ZERO, fill byte 0), but
//     its loader accepts any fill byte, so Split does too.
package devstate
