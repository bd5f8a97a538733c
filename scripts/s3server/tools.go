//go:build tools

// Package tools pins VersityGW, the S3-compatible server that tests/harness/objectstore/s3.py runs over a posix
// folder; scripts/s3server/build.sh builds it.
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
