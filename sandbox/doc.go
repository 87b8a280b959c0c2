// Package sandbox runs one pod's VM: it boots it, restores it from a
// snapshot, checkpoints it into one and shuts it down, and hands the task
// service the guest agent inside it. It knows nothing of containerd's task
// API: shim/ holds a Sandbox through a small interface.
//
// Boot, Restore and Checkpoint are lists of named steps (steps.go): each
// is timed and logged, and what a step made is undone, latest first, when
// a later one fails, so a refusal leaves no QEMU, mount, socket or file
// behind.
package sandbox
