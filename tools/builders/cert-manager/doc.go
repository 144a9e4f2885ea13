// Package certmanager builds cert-manager's controller and webhook for the lab from the
// github.com/cert-manager/cert-manager module at the pinned version.
//
// cert-manager's own main packages (cmd/controller, cmd/webhook) are separate modules that
// replace the root module by a relative path, and the module proxy does not serve them, so
// this module wires the same packages of the root module into two small programs. Its path
// sits under cert-manager's own so Go's internal-package rule lets it use the configuration
// types and the webhook server the upstream programs use.
package certmanager
