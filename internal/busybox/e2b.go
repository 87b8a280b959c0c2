package busybox

// E2BTemplate is the image of an E2B template on busybox: every applet,
// E2B's user "user" with home /home/user, and a /bin/bash, since E2B's
// SDK runs every command as `/bin/bash -l -c CMD` and every PTY as
// `/bin/bash -i -l`: here busybox's sh under that name. It runs cmd.
func E2BTemplate(name string, cmd []string) Spec {
	return Spec{
		Name: name, Cmd: cmd, AllApplets: true,
		Files: []File{
			{Path: "bin/bash", Mode: 0o755, Content: "#!/bin/sh\nexec /bin/sh \"$@\"\n"},
			{Path: "etc/passwd", Mode: 0o644, Content: "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/bash\nnobody:x:65534:65534:nobody:/:/bin/sh\n"},
			{Path: "etc/group", Mode: 0o644, Content: "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"},
			{Path: "home/user", Dir: true, Mode: 0o755, UID: 1000, GID: 1000},
			{Path: "root", Dir: true, Mode: 0o700},
		},
	}
}
