//go:build tools

// Package tools pins CoreDNS, which scripts/cluster/build.sh builds.
package tools

import _ "github.com/coredns/coredns"
