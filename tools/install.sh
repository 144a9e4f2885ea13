#!/usr/bin/env bash
# make tools: puts every pinned external binary (tools/versions.env) into one directory,
# $KONTINUUM_TOOLS/bin, which the Makefile and the tests put first on PATH.
#
# For each tool: a binary already on PATH with the pinned version is linked (for the engine,
# any release of the same major at least as new as the pin; for the Kubernetes provider, the
# pinned version installed in the user's Pulumi plugin directory); one built by an earlier
# run from the cache is reused; otherwise it is built from its Go module into the cache
# (outside the repo, shared by later runs and CI). Official download sites are unreachable
# here, so building from the Go module proxy is the only way in.
#
# KONTINUUM_FAKE_BUILDERS=<program> swaps every builder for `<program> NAME VERSION OUTDIR`
# (tests/unit/test_install_script.py exercises every branch in seconds with it).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache=${KONTINUUM_TOOLS_CACHE:-$HOME/.cache/kontinuum/tools}
# Our own compiled tool (tools/plugin-guard) is versioned by its source; the tool directory by
# the pins and that version, so checkouts with different guards never share one directory.
guard_version=$(cat "$here/plugin-guard/go.mod" "$here/plugin-guard/main.go" | sha256sum | cut -c1-12)
pins=$({ grep -E '^[A-Z_]+=' "$here/versions.env"; echo "plugin-guard $guard_version"; } | sha256sum | cut -c1-12)
bin=${KONTINUUM_TOOLS:-$cache/$pins}/bin
if [ "${1:-}" = "--print-bin" ]; then echo "$bin"; exit 0; fi
mkdir -p "$bin"
fake=${KONTINUUM_FAKE_BUILDERS:-}

say() { printf '[tools] %s\n' "$*" >&2; }
die() { printf '[tools] cannot provide %s: %s\n' "$1" "$2" >&2; exit 1; }

if [ -z "$fake" ]; then
  command -v go >/dev/null || die "any tool" "Go is not installed (apt-get install golang or see README prerequisites)"
  # No DWARF from the compiler: every binary is linked with -s -w, which drops it anyway. A cold
  # kwok build: 20 % less wall and 19 % less CPU (user+sys 249 → 202 s), the same binary size.
  export GOFLAGS="-mod=mod -gcflags=all=-dwarf=false" GOTOOLCHAIN=local
  # The compiler and linker collect garbage a quarter as often: measured on a cold kwok build,
  # 17 % less CPU (user+sys 397 → 328 s) for 6 % more peak memory (1.10 → 1.17 GB).
  export GOGC=${GOGC:-400}
  export GOPATH=${GOPATH:-$(go env GOPATH)}
fi
# Where the user's own Pulumi keeps its plugins (never the project's PULUMI_HOME under .state).
user_plugins=${KONTINUUM_USER_PULUMI_HOME:-$HOME/.pulumi}/plugins

# version_of NAME: prints the version a binary reports, or nothing.
version_of() {
  case "$1" in
    pulumi) "$2" version 2>/dev/null | head -n1 ;;
    # The plugins report their version only over gRPC, pebble-challtestsrv not at all, the Flux
    # Operator only once connected to a cluster; their directory is versioned, either ours
    # (<cache>/<name>/<version>/) or Pulumi's (plugins/resource-kubernetes-v<version>/).
    pulumi-language-python|pulumi-resource-kubernetes|pebble-challtestsrv|flux-operator|source-controller|kustomize-controller|notification-controller)
      local dir; dir=$(dirname "$(readlink -f "$2")")
      case $dir in
        */$1/*) basename "$dir" ;;
        */resource-kubernetes-v*) basename "$dir" | sed 's/^resource-kubernetes-v//' ;;
      esac ;;
    kontinuum-talos-validate|kontinuum-plugin-guard) "$2" --version 2>/dev/null ;;
    etcd) "$2" --version 2>/dev/null | sed -n 's/^etcd Version: /v/p' ;;
    # `talosctl version --client --short` prints "Client:" then "Talos <tag>".
    talosctl) "$2" version --client --short 2>/dev/null | sed -n 's/^Talos \(v[^ ]*\)$/\1/p' ;;
    etcdutl) "$2" version 2>/dev/null | sed -n 's/^etcdutl version: /v/p' ;;
    kube-*) "$2" --version 2>/dev/null | awk '{print $2}' ;;
    kwok) "$2" --version 2>/dev/null | sed -n 's/.*kwok version \(v[^ ]*\).*/\1/p' ;;
    pebble) "$2" -version 2>/dev/null | sed -n 's/^Pebble version: //p' ;;
    cert-manager-*) "$2" --version 2>/dev/null | head -n1 ;;
    # `weed version` prints "version 30GB 4.53 <COMMIT> linux amd64"; our build stamps the
    # module version into COMMIT.
    weed) "$2" version 2>/dev/null | sed -n 's/^version .* \(v[0-9][^ ]*\) [a-z0-9]* [a-z0-9]*$/\1/p' ;;
  esac
}

# acceptable NAME WANT GOT: the pinned version, or for the engine a newer one of the same
# major (its plugin protocol is stable within a major; older engines lack what we use).
acceptable() {
  [ "$3" = "$2" ] && return 0
  [ "$1" = pulumi ] || return 1
  [[ $3 =~ ^v([0-9]+)\.[0-9]+\.[0-9]+$ && ${BASH_REMATCH[1]} == "$(echo "$2" | sed 's/^v\([0-9]*\).*/\1/')" ]] || return 1
  [ "$(printf '%s\n%s\n' "${2#v}" "${3#v}" | sort -V | head -n1)" = "${2#v}" ]
}

# installed NAME WANT: a matching binary the user already has, if any (PATH, or for the
# Kubernetes provider the user's Pulumi plugin directory). Says why a found one is not used.
# The first that fits is used.
installed() {
  local name=$1 want=$2 found got
  for found in "$(PATH=${PATH//$bin:/} command -v "$name" || true)" \
    "$( [ "$name" = pulumi-resource-kubernetes ] && echo "$user_plugins/resource-kubernetes-v$want/$name")"; do
    [ -n "$found" ] && [ -x "$found" ] || continue
    got=$(version_of "$name" "$found")
    if acceptable "$name" "$want" "$got"; then echo "$found"; return 0; fi
    say "$name $want: not using $found (it reports '${got:-no version}')"
  done
}

# build NAME VERSION BUILDER OUTDIR: the real builder, or the stand-in in fake mode.
build() {
  if [ -n "$fake" ]; then "$fake" "$1" "$2" "$4"; else "$3" "$4"; fi
}

# provide NAME VERSION BUILDER: link NAME into $bin, building it with BUILDER if needed.
provide() {
  local name=$1 want=$2 builder=$3 out="$cache/$1/$2" got found
  got=$( [ -x "$bin/$name" ] && version_of "$name" "$bin/$name" || true)
  if [ -n "$got" ] && acceptable "$name" "$want" "$got"; then
    say "$name $want: ready ($got: $(readlink -f "$bin/$name"))"; return
  fi
  found=$(installed "$name" "$want")
  if [ -n "$found" ] && [ "$name" = pulumi ]; then
    # The engine takes its bundled plugins (language hosts, the dynamic-provider host) from
    # beside its own binary before its plugin directory: a copy beside nothing uses ours.
    got=$(version_of "$name" "$found") out="$cache/$name/$got"
    if ! cmp -s "$found" "$out/$name"; then
      mkdir -p "$out" && cp -f "$found" "$out/$name.tmp" && mv -f "$out/$name.tmp" "$out/$name"
    fi
    say "$name $want: using $found ($got), already installed (copied to $out)"; ln -sfn "$out/$name" "$bin/$name"; return
  elif [ -n "$found" ]; then
    got=$(version_of "$name" "$found")
    say "$name $want: using $found ($got), already installed"; ln -sfn "$found" "$bin/$name"; return
  fi
  if [ ! -x "$out/$name" ]; then
    say "$name $want: building from its Go module (first time only; cached in $out)"
    local t0=$SECONDS
    rm -rf "$out.tmp"; mkdir -p "$out.tmp"
    if ! build "$name" "$want" "$builder" "$out.tmp"; then
      rm -rf "$out.tmp"  # nothing half-built is ever taken for a cached tool
      die "$name $want" "the Go build failed (see the output above); run \`make tools\` again after fixing it"
    fi
    rm -rf "$out"; mv "$out.tmp" "$out"
    say "$name $want: built in $((SECONDS - t0)) s"
  else
    say "$name $want: cached"
  fi
  ln -sfn "$out/$name" "$bin/$name"
  got=$(version_of "$name" "$bin/$name")
  [ "$got" = "$want" ] || die "$name $want" "the built binary reports version '$got'"
}

# Each builder gets a fresh output directory and must leave the binary in it.
build_plugin_guard() { # ours, standard library only: seconds
  (cd "$here/plugin-guard" &&
    go build -trimpath -ldflags "-s -w -X main.version=$guard_version" -o "$1/kontinuum-plugin-guard" .)
}

build_pulumi() {
  (cd "$here/builders/pulumi" &&
    go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" \
      -o "$1/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
}

build_language_python() {
  (cd "$here/builders/pulumi-language-python" &&
    go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_LANGUAGE_PYTHON_VERSION" \
      -o "$1/pulumi-language-python" github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python) || return 1
  # The host runs the exec shim that sits next to it; take it from the SDK release that
  # matches the pinned Python SDK.
  local sdk; sdk=$(go mod download -json "github.com/pulumi/pulumi/sdk/v3@$PULUMI_PYTHON_SDK_VERSION" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$1/pulumi-language-python-exec"
}

build_kubernetes_provider() ( # a subshell: its EXIT trap cleans up and cannot fire later
  # The provider embeds schema-embed.json, written by its `go generate` step from
  # schema.json with VERSION set, so it is built from a writable copy of the module.
  local mod="github.com/pulumi/pulumi-kubernetes/provider/v4" src work
  src=$(go mod download -json "$mod@$PULUMI_KUBERNETES_MODULE" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  work=$(mktemp -d); trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
  cp -r "$src/." "$work"; chmod -R u+w "$work"
  # Its go.mod replaces the sdk module by a sibling path that is not in the module zip;
  # the required published version is used instead.
  sed -i '/^replace github.com\/pulumi\/pulumi-kubernetes\/sdk\/v4 => /d' "$work/go.mod"
  (cd "$work/cmd/pulumi-resource-kubernetes" && VERSION="$PULUMI_KUBERNETES_VERSION" go run ./generate.go &&
    go build -trimpath -ldflags "-s -w -X $mod/pkg/version.Version=$PULUMI_KUBERNETES_VERSION" \
      -o "$1/pulumi-resource-kubernetes" .)
)

build_etcd() {
  (cd "$here/builders/etcd" && go build -trimpath -ldflags "-s -w" -o "$1/etcd" .)
}

build_etcdutl() {
  (cd "$here/builders/etcdutl" && go build -trimpath -ldflags "-s -w" -o "$1/etcdutl" go.etcd.io/etcd/etcdutl/v3)
}

build_kubernetes() {
  # k8s.io/kubernetes replaces its staging modules by relative path; this builder module
  # requires k8s.io/kubernetes and pins every staging module to the matching v0.x release.
  local gomod work staging
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  staging="v0.${KUBERNETES_VERSION#v1.}"
  work="$cache/kubernetes-builder/$KUBERNETES_VERSION"; mkdir -p "$work"
  {
    echo "module kontinuum.local/tools/kubernetes"
    echo "go 1.25"
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 '"$staging"'#p' "$gomod"
  } >"$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n)\n' >"$work/tools.go"
  (cd "$work" &&
    for c in kube-apiserver kube-controller-manager kube-scheduler; do
      say "  compiling $c"
      go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION" \
        -o "$1/$c" "k8s.io/kubernetes/cmd/$c" || return 1
    done)
}

build_kube_component() { # the three share one build; link the others from it
  local dir="$cache/kubernetes/$KUBERNETES_VERSION"
  if [ ! -x "$dir/kube-apiserver" ]; then
    rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"; build_kubernetes "$dir.tmp" || return 1
    rm -rf "$dir"; mv "$dir.tmp" "$dir"
  fi
  cp "$dir/$component" "$1/$component"
}

build_talos_validate() {
  (cd "$here/builders/talos-validate" &&
    go build -trimpath -ldflags "-s -w -X main.version=$TALOS_MACHINERY_VERSION" -o "$1/kontinuum-talos-validate" .)
}

build_kwok() {
  GOBIN="$1" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

build_pebble_pair() { # pebble and pebble-challtestsrv share one build; link the other from it
  local dir="$cache/pebble-build/$PEBBLE_VERSION"
  if [ ! -x "$dir/pebble" ]; then
    rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
    GOBIN="$dir.tmp" go install -trimpath -ldflags "-s -w -X main.version=$PEBBLE_VERSION" \
      "github.com/letsencrypt/pebble/v2/cmd/pebble@$PEBBLE_VERSION" \
      "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@$PEBBLE_VERSION" || return 1
    rm -rf "$dir"; mv "$dir.tmp" "$dir"
  fi
  cp "$dir/$component" "$1/$component"
}

build_cert_manager_pair() { # controller and webhook share one build (tools/builders/cert-manager)
  local dir="$cache/cert-manager-build/$CERT_MANAGER_VERSION"
  if [ ! -x "$dir/controller" ]; then
    rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
    (cd "$here/builders/cert-manager" &&
      go build -trimpath -ldflags "-s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$CERT_MANAGER_VERSION" \
        -o "$dir.tmp/" ./controller ./webhook) || return 1
    rm -rf "$dir"; mv "$dir.tmp" "$dir"
  fi
  cp "$dir/${component#cert-manager-}" "$1/$component"
}

build_weed() ( # a subshell: its EXIT trap cleans up and cannot fire later
  # The module's go.mod carries a replace directive, which `go install mod@version` refuses:
  # it is built as the main module from a writable copy.
  local mod="github.com/seaweedfs/seaweedfs" src work
  src=$(go mod download -json "$mod@$SEAWEEDFS_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  work=$(mktemp -d); trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
  cp -r "$src/go.mod" "$src/go.sum" "$src/weed" "$src/telemetry" "$work"; chmod -R u+w "$work"
  (cd "$work" && go build -trimpath -ldflags "-s -w -X $mod/weed/util/version.COMMIT=$SEAWEEDFS_VERSION" \
    -o "$1/weed" ./weed)
)

build_flux_operator() ( # a subshell: its EXIT trap cleans up and cannot fire later
  # The operator embeds its web UI (web/dist), which the module zip leaves out: it is built
  # from a writable copy with a one-page placeholder UI (the lab never serves it). Upstream
  # builds with GOFIPS140=latest and the binary refuses to start outside FIPS 140-3 mode.
  local mod="github.com/controlplaneio-fluxcd/flux-operator" src work
  src=$(go mod download -json "$mod@$FLUX_OPERATOR_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  work=$(mktemp -d); trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
  cp -r "$src/." "$work"; chmod -R u+w "$work"
  mkdir -p "$work/web/dist"
  # v0.58.1 requires a go-containerregistry/pkg/authn/kubernetes pseudo-version the module
  # proxy refuses (403, "not available"); the proxy's latest one (Feb 2026) has the same API.
  (cd "$work" && go mod edit -replace "$FLUX_OPERATOR_AUTHN_KUBERNETES")
  echo '<!doctype html><title>flux-operator</title><p>web UI not built (kontinuum lab build)</p>' >"$work/web/dist/index.html"
  (cd "$work" && CGO_ENABLED=0 GOFIPS140=latest go build -trimpath \
    -ldflags "-s -w -X main.VERSION=$FLUX_OPERATOR_VERSION" -o "$1/flux-operator" ./cmd/operator)
)

build_flux_controller() ( # a subshell: its EXIT trap cleans up and cannot fire later
  # Flux's own source-, kustomize- or notification-controller ($component), at the release the
  # pinned operator's default distribution ships ($version). Built as the main module from a writable copy: its
  # go.mod replaces the nested api module by ./api, which the module zip leaves out (the
  # published api module of the same version, which go.mod requires, is used instead).
  local mod="github.com/fluxcd/$component" src work
  src=$(go mod download -json "$mod@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  work=$(mktemp -d); trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
  cp -r "$src/go.mod" "$src/go.sum" "$src/main.go" "$src/internal" "$work"; chmod -R u+w "$work"
  (cd "$work" && go mod edit -dropreplace "$mod/api") || return 1
  if [ "$component" = source-controller ]; then (cd "$work" && go mod edit -replace "$FLUX_SOURCE_CONTROLLER_ARTIFACT") || return 1; fi
  (cd "$work" && CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags "-s -w" -o "$1/$component" .)
)

build_talosctl() ( # a subshell: its EXIT trap cleans up and cannot fire later
  # Built as the main module from a writable copy of the Talos module. Its go.mod replaces the
  # nested pkg/machinery module by a path the module zip leaves out (the published module of the
  # same version is used) and containerd by a fork the module proxy refuses to serve (the
  # required upstream release is used; the fork only trims dead code from machined).
  local mod="github.com/siderolabs/talos" src work
  src=$(go mod download -json "$mod@$TALOSCTL_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  work=$(mktemp -d); trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
  cp -r "$src/go.mod" "$src/go.sum" "$src/cmd" "$src/internal" "$src/pkg" "$work"; chmod -R u+w "$work"
  (cd "$work" && go mod edit -dropreplace github.com/siderolabs/talos/pkg/machinery \
    -dropreplace github.com/containerd/containerd/v2) || return 1
  # Upstream's release flags (Makefile: GO_BUILDTAGS_TALOSCTL, -s -w); the version comes from
  # the machinery module's embedded tag.
  (cd "$work" && CGO_ENABLED=0 GOWORK=off go build -trimpath -tags grpcnotrace -ldflags "-s -w" -o "$1/talosctl" ./cmd/talosctl)
)

# What each job needs (README, "Tools"): a region's pipeline runs only the product; the lab adds
# the control plane, kwok, Pebble and cert-manager; the tests add the S3 server, the Flux Operator,
# Flux's source-, kustomize- and notification-controller and talosctl.
product_tools="kontinuum-plugin-guard pulumi pulumi-language-python pulumi-resource-kubernetes kontinuum-talos-validate"
lab_tools="$product_tools etcd etcdutl kube-apiserver kube-controller-manager kube-scheduler kwok pebble pebble-challtestsrv cert-manager-controller cert-manager-webhook"
all_tools="$lab_tools weed flux-operator source-controller kustomize-controller notification-controller talosctl"

# provide_tool NAME: provide one tool at its pin with its builder.
provide_tool() {
  case $1 in
    kontinuum-plugin-guard) provide "$1" "$guard_version" build_plugin_guard ;;
    pulumi) provide pulumi "$PULUMI_VERSION" build_pulumi ;;
    pulumi-language-python) provide "$1" "$PULUMI_LANGUAGE_PYTHON_VERSION" build_language_python ;;
    pulumi-resource-kubernetes) provide "$1" "$PULUMI_KUBERNETES_VERSION" build_kubernetes_provider ;;
    kontinuum-talos-validate) provide "$1" "$TALOS_MACHINERY_VERSION" build_talos_validate ;;
    etcd) provide etcd "$ETCD_VERSION" build_etcd ;;
    etcdutl) provide etcdutl "$ETCDUTL_VERSION" build_etcdutl ;;
    kube-*) component=$1 provide "$1" "$KUBERNETES_VERSION" build_kube_component ;;
    kwok) provide kwok "$KWOK_VERSION" build_kwok ;;
    pebble*) component=$1 provide "$1" "$PEBBLE_VERSION" build_pebble_pair ;;
    cert-manager-*) component=$1 provide "$1" "$CERT_MANAGER_VERSION" build_cert_manager_pair ;;
    weed) provide weed "$SEAWEEDFS_VERSION" build_weed ;;
    flux-operator) provide flux-operator "$FLUX_OPERATOR_VERSION" build_flux_operator ;;
    talosctl) provide talosctl "$TALOSCTL_VERSION" build_talosctl ;;
    source-controller|kustomize-controller) component=$1 version=$FLUX_CONTROLLERS_VERSION provide "$1" "$FLUX_CONTROLLERS_VERSION" build_flux_controller ;;
    notification-controller) component=$1 version=$FLUX_NOTIFICATION_CONTROLLER_VERSION \
      provide "$1" "$FLUX_NOTIFICATION_CONTROLLER_VERSION" build_flux_controller ;;
  esac
}

# Arguments name tools or the sets product, lab and all (the default).
wanted=" "
for arg in "${@:-all}"; do
  case $arg in
    product) wanted+="$product_tools " ;;
    lab) wanted+="$lab_tools " ;;
    all) wanted+="$all_tools " ;;
    *) [[ " $all_tools " == *" $arg "* ]] || die "$arg" "no such tool (tools: $all_tools; sets: product, lab, all)"
       wanted+="$arg " ;;
  esac
done
want() { [[ $wanted == *" $1 "* ]]; }

# Units of work, the longest cold build first (README, "Tools"); the tools of a unit share one
# build or one module graph and go one after the other. Units run side by side, KONTINUUM_TOOLS_JOBS
# at a time (2): one Go build alone leaves a core idle while it links or waits on a download. A
# failed unit stops only itself: the others finish and stay cached, and the run then fails naming it.
units=(
  "pulumi-resource-kubernetes" "kube-apiserver kube-controller-manager kube-scheduler" "pulumi" "talosctl" "weed"
  "cert-manager-controller cert-manager-webhook" "flux-operator" "source-controller kustomize-controller notification-controller" "kwok" "etcd etcdutl"
  "kontinuum-talos-validate" "pulumi-language-python" "pebble pebble-challtestsrv" "kontinuum-plugin-guard"
)
lanes=${KONTINUUM_TOOLS_JOBS:-2}
failed=$(mktemp -d); trap 'rm -rf "$failed"' EXIT
run_unit() { local tool; for tool in $1; do if want "$tool"; then provide_tool "$tool"; fi; done; }

t0=$SECONDS
say "tool directory: $bin"
i=0
for unit in "${units[@]}"; do
  any=; for tool in $unit; do if want "$tool"; then any=1; fi; done
  [ -n "$any" ] || continue
  while [ "$(jobs -pr | wc -l)" -ge "$lanes" ]; do wait -n || true; done
  ( (run_unit "$unit") || echo "$unit" >"$failed/$i" ) &
  i=$((i + 1))
done
wait
if [ -n "$(ls -A "$failed")" ]; then
  say "not provided (see above): $(cat "$failed"/* | tr '\n' ' ')"
  exit 1
fi
# Our dynamic-provider launcher is not a shared tool: tools/pulumi puts this checkout's
# tools/plugins on PATH. (Earlier versions linked it here, tying the cache to one checkout.)
rm -f "$bin/pulumi-resource-pulumi-python"
say "tools ready in $((SECONDS - t0)) s"
echo "$bin"
