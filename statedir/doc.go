// Package statedir is how a process of the mesh holds and writes the
// state directory it keeps (the agent's, the control side's key
// directory): one process at a time by an exclusive lock on the directory
// (LockDir), files replaced whole (WriteFile, WriteBytes), and a refused
// access said as what an operator acts on (ExplainAccess). It is neither
// side's: the agent and the control side both import it, and it imports
// nothing of theirs.
package statedir
