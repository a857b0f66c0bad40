// Package e2e runs the whole loop with real processes on loopback: the
// control side with its embedded NATS broker, the executor as root, the
// agent dropping to an unprivileged user, and declarations signed,
// published, drained, verified twice, applied and reported back.
package e2e
