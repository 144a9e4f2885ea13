// kontinuum-plugin-guard: our own launcher for the Go plugins (tools/plugins), standard library only.
module kontinuum.local/tools/plugin-guard

go 1.26.1
