// kontinuum-plugin-guard execs a Go plugin (the kubernetes provider, the Python language host) so
// that it dies with the engine that started it, at the cost of no interpreter start.
//
// The engine starts each plugin in a process group of its own, so a CI runner that SIGKILLs
// `pulumi up` (its whole process group) leaves the plugins running. The launchers in tools/plugins
// exec this guard with the engine's pid; in the same process, before exec'ing the plugin, it
//
//   - asks the kernel for SIGKILL when the parent (the engine) dies (PR_SET_PDEATHSIG, kept
//     across exec);
//   - refuses to start when the engine is already gone (the signal would never come);
//   - gives the plugin a 0700 temporary directory of its engine's own (TMPDIR), after removing
//     those of engines that are gone: pulumi-resource-kubernetes writes its kubeconfig (client
//     keys) to a temporary file on every start and never removes it.
//
// The Python dynamic-provider host keeps tools/plugins/plugin_guard.py (it is Python anyway).
//
// Usage: kontinuum-plugin-guard <engine-pid> exec <binary> [args...]
//
//	kontinuum-plugin-guard --version
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// version is the hash of this source, stamped by tools/install.sh.
var version = "dev"

const (
	prSetPdeathsig = 1
	tmpPrefix      = "kontinuum-plugins-" // + the engine's pid
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println(version)
		return
	}
	if len(os.Args) < 4 || os.Args[2] != "exec" {
		fail(2, "usage: kontinuum-plugin-guard <engine-pid> exec <binary> [args...]")
	}
	engine, err := strconv.Atoi(os.Args[1])
	if err != nil || engine <= 0 {
		fail(2, "the engine pid %q is not a pid", os.Args[1])
	}
	// The death signal is a setting of the calling thread, and exec keeps it only for the thread
	// that execs: both happen on this one.
	runtime.LockOSThread()
	dieWithParent(engine)
	tmp, err := privateTmp(engine, tempBase())
	if err != nil {
		fail(1, "%v", err)
	}
	env := []string{"TMPDIR=" + tmp}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TMPDIR=") {
			env = append(env, kv)
		}
	}
	binary := os.Args[3]
	err = syscall.Exec(binary, os.Args[3:], env)
	fail(1, "cannot exec %s: %v", binary, err)
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kontinuum-plugin-guard: "+format+"\n", args...)
	os.Exit(code)
}

// dieWithParent arms PR_SET_PDEATHSIG, then makes sure the engine did not die before it was armed.
func dieWithParent(engine int) {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetPdeathsig, uintptr(syscall.SIGKILL), 0); errno != 0 {
		fmt.Fprintf(os.Stderr, "kontinuum-plugin-guard: prctl(PR_SET_PDEATHSIG) failed: %v\n", errno)
	}
	if syscall.Getppid() != engine {
		fail(1, "the engine (pid %d) is gone; not starting", engine)
	}
}

// tempBase is where temporary directories go: TMPDIR, TEMP or TMP, else /tmp (as Python's
// tempfile.gettempdir reads them).
func tempBase() string {
	for _, name := range []string{"TMPDIR", "TEMP", "TMP"} {
		if dir := os.Getenv(name); dir != "" {
			return dir
		}
	}
	return "/tmp"
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM) // EPERM: someone else's process
}

// privateTmp returns a 0700 directory for the plugins of this engine under base; the directories
// of engines that are gone (killed ones too, whose plugins could not clean up) are removed first.
func privateTmp(engine int, base string) (string, error) {
	entries, _ := os.ReadDir(base) // an unreadable base: nothing to tidy, the mkdir below says why
	for _, e := range entries {
		digits := strings.TrimPrefix(e.Name(), tmpPrefix)
		if !strings.HasPrefix(e.Name(), tmpPrefix) || digits == "" || strings.Trim(digits, "0123456789") != "" {
			continue
		}
		if pid, err := strconv.Atoi(digits); err != nil || pid == engine || alive(pid) {
			continue
		}
		_ = os.RemoveAll(filepath.Join(base, e.Name()))
	}
	path := filepath.Join(base, tmpPrefix+strconv.Itoa(engine))
	if err := os.Mkdir(path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("cannot make the plugins' temporary directory: %w", err)
	}
	return path, nil
}
