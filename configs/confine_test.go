package configs

import (
	"strings"
	"testing"
)

func TestConfineQEMUDefaultsOnOffOnlyExplicitly(t *testing.T) {
	c := Default()
	if !c.Hypervisor.ConfineQEMU || c.Hypervisor.QEMUUIDBase < 1 || c.Hypervisor.QEMUUIDCount < 1 {
		t.Fatalf("defaults: %+v", c.Hypervisor)
	}
	if err := Decode([]byte("[hypervisor]\nhotplug_ports = 4\n"), &c); err != nil || !c.Hypervisor.ConfineQEMU {
		t.Errorf("a config without confine_qemu: %v, confine %v", err, c.Hypervisor.ConfineQEMU)
	}
	if err := Decode([]byte("[hypervisor]\nconfine_qemu = false\n"), &c); err != nil || c.Hypervisor.ConfineQEMU {
		t.Errorf("confine_qemu = false: %v, confine %v", err, c.Hypervisor.ConfineQEMU)
	}
	for key, bad := range map[string]string{
		"qemu_uid_base":    "qemu_uid_base = 0",
		"qemu_uid_count":   "qemu_uid_count = -1",
		"console_log_size": "console_log_size = 1",
	} {
		c := Default()
		if err := Decode([]byte("[hypervisor]\n"+bad+"\n"), &c); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
