// Package selinux holds no Go code of the host: it is the folder of the
// SELinux policy for the two domains (mesh_agent.te/.fc/.if,
// mesh_executor.te/.fc/.if) and the Android sepolicy fragment (android/),
// and of the test that compiles the policy with selinux-policy-dev, links it
// into a policy store of its own with Debian's selinux-policy-default, and
// asserts with sesearch what the agent's domain may and may not do.
//
// The test never installs the modules into the machine's policy and never
// changes the machine's SELinux state; it does not prove the policy
// sufficient on a running enforcing system (see docs/selinux.md).
package selinux
