package control

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nox-mesh/nox-mesh-host/wire"
)

// keyRotate asks serve to rotate the control key (KeysSubject) and says
// what it did.
func (c *cli) keyRotate(recoveryKey string) error {
	if recoveryKey != "" {
		abs, err := filepath.Abs(recoveryKey)
		if err != nil {
			return err
		}
		recoveryKey = abs // serve reads it, from its own directory
		// Said, not refused: in a theft's aftermath the key comes off
		// whatever medium kept it (a FAT stick shows every file 0755).
		if fi, err := os.Stat(recoveryKey); err == nil && fi.Mode().Perm()&0o077 != 0 {
			fmt.Fprintf(c.stderr, "warning: the recovery key %s is readable by others than its owner (mode %04o): once the rotation is made, keep it off this machine again, or chmod 600 it\n", recoveryKey, fi.Mode().Perm())
		}
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	var res RotateResult
	if err := askServe(c.ctx, cl, KeysSubject, &RotateRequest{RecoveryKeyFile: recoveryKey}, &res); err != nil {
		return err
	}
	if c.json {
		if err := c.printJSON(&res); err != nil {
			return err
		}
	} else if res.To != "" && res.Error == "" {
		how := "signed by the key retired and by the new one"
		if res.By == wire.ByRecovery {
			how = "signed by the recovery key and by the new one"
		}
		fmt.Fprintf(c.stdout, "control key %s rotated to %s (rotation %d, %s): announced to %d node(s); %d signed again by the new key\n",
			res.From, res.To, res.Seq, how, res.Nodes, res.Republished)
		switch {
		case len(res.Held) > 0 && res.By == wire.ByRecovery:
			fmt.Fprintf(c.stdout, "held, their newest declaration not signed again (sealed content, or signed before the key retired): %s — sent the recovery alone, now and at their heartbeats until they hold it: each refuses that declaration if it has not applied it yet (the stolen key signed it); declare to them again\n", strings.Join(res.Held, ", "))
		case len(res.Held) > 0:
			fmt.Fprintf(c.stdout, "held, their newest declaration not signed again (sealed content, or signed before the key retired): %s — each takes the rotation with its next declaration\n", strings.Join(res.Held, ", "))
		}
		if rest := res.Nodes - res.Republished - len(res.Held); rest > 0 {
			fmt.Fprintf(c.stdout, "%d with no declaration to sign again take the rotation alone: %d sent it now, any other with its next heartbeat\n", rest, res.Alone)
		}
		if len(res.LeftBehind) > 0 {
			fmt.Fprintf(c.stdout, "left behind, of a release before rotations: %s — upgrade and enrol them again\n", strings.Join(res.LeftBehind, ", "))
		}
	}
	if res.Error != "" {
		return errors.New(res.Error)
	}
	return nil
}

// certRotate asks serve for a step of the broker certificate's rotation
// (CertSubject) and says what it did.
// rotationStep asks serve for one step of a rotation on subject (req,
// answered into res, whose error is *failed), and prints it: as JSON, or
// as say says it when it did not fail.
func (c *cli) rotationStep(subject string, switching, force bool, req, res any, failed *string, say func()) error {
	if force && !switching {
		return errors.New("--force is for --switch: the announcement needs none")
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := askServe(c.ctx, cl, subject, req, res); err != nil {
		return err
	}
	if c.json {
		if err := c.printJSON(res); err != nil {
			return err
		}
	} else if *failed == "" {
		say()
	}
	if *failed != "" {
		return errors.New(*failed)
	}
	return nil
}

func (c *cli) certRotate(switchCert, force bool) error {
	var res CertResult
	return c.rotationStep(CertSubject, switchCert, force, &CertRequest{Switch: switchCert, Force: force}, &res, &res.Error, func() {
		switch res.Phase {
		case "announced":
			fmt.Fprintf(c.stdout, "broker certificate %s announced beside %s (statement %d) to %d node(s); %d declaration(s) signed again to carry it\n",
				res.Next, res.Current, res.Seq, res.Nodes, res.Republished)
			if res.Nodes > res.Republished {
				fmt.Fprintf(c.stdout, "%d sent it alone (no declaration to sign again, or one holding sealed content), any away with their next heartbeat\n", res.Alone)
			}
			c.next("mesh-control cert rotate --switch" + c.dirFlag() + "    # once mesh-control nodes --json shows every node's heartbeat.broker_pins_seq at " + fmt.Sprint(res.Seq))
		case "switched":
			fmt.Fprintf(c.stdout, "the broker presents certificate %s now; nodes accept it alone (statement %d)\n", res.Current, res.Seq)
			if len(res.NotYet) > 0 {
				fmt.Fprintf(c.stdout, "switched despite: %s — they cannot link until enrolled again\n", strings.Join(res.NotYet, ", "))
			}
			if res.Reload != "" {
				fmt.Fprintf(c.stdout, "still to do: %s\n", res.Reload)
			}
		}
	})
}

// routesRotate carries out a step of a cluster's route certificate's
// rotation (RotateRoutes) in dir, and says what it did. The files are the
// operator's, beside the servers' configurations: no serve is asked.
func (c *cli) routesRotate(dir string, switchCert, force bool, pidList string) error {
	if force {
		return errors.New("--force is for the broker's certificate: a route switch waits for the servers by itself, and is run again for one that was not reloaded")
	}
	var pids []string
	if pidList != "" {
		pids = strings.Split(pidList, ",")
	}
	res, err := RotateRoutes(dir, switchCert, pids)
	if res == nil {
		return err
	}
	if c.json {
		if perr := c.printJSON(res); perr != nil {
			return perr
		}
		return err
	}
	switch res.Phase {
	case "announced":
		fmt.Fprintf(c.stdout, "route certificate %s announced beside %s: each server accepts both once reloaded (%s)\n", res.Next, res.Current, filepath.Join(dir, RouteCAFile))
		if res.Reload != "" {
			fmt.Fprintf(c.stdout, "still to do: %s\n", res.Reload)
		}
		c.next("mesh-control cert rotate --routes " + dir + " --switch" + pidFlag(pidList) + "    # once every server is reloaded")
	case "switched":
		fmt.Fprintf(c.stdout, "every server presents route certificate %s on its route port and accepts it alone\n", res.Current)
		if res.Reload != "" {
			fmt.Fprintf(c.stdout, "still to do: %s\n", res.Reload)
		}
	case "switching":
		for _, s := range res.Servers {
			fmt.Fprintf(c.stdout, "%s\t%s\tpresents %s\n", s.Name, s.Route, orNone(s.Presents))
		}
	}
	return err
}

func pidFlag(pids string) string {
	if pids == "" {
		return ""
	}
	return " --broker-pid " + pids
}

func orNone(s string) string {
	if s == "" {
		return "nothing (it did not answer)"
	}
	return s
}

func (c *cli) accountKeyRotate(switchKey, force bool) error {
	var res AccountKeyResult
	return c.rotationStep(AccountKeySubject, switchKey, force, &AccountKeyRequest{Switch: switchKey, Force: force}, &res, &res.Error, func() {
		switch res.Phase {
		case "announced":
			fmt.Fprintf(c.stdout, "nodes' account key %s announced beside %s; %d of %d node(s) sign in with a JWT of it so far (each is sent one at its next heartbeat)\n",
				res.Next, res.Current, res.Nodes-len(res.NotYet), res.Nodes)
			fmt.Fprintf(c.stdout, "control side's signing key %s announced beside %s: serve and the commands sign in with it from their next connection\n", res.ControlNext, res.ControlCurrent)
			c.next("mesh-control account-key rotate --switch" + c.dirFlag() + "    # once mesh-control nodes --json shows every node's heartbeat.jwt_issuer at " + res.Next)
		case "switched":
			fmt.Fprintf(c.stdout, "the nodes' account key is %s now; every node's account lists it alone\n", res.Current)
			if res.ControlSwitched {
				fmt.Fprintf(c.stdout, "the control side's signing key is %s now; the system account and CONTROL list it alone, and the broker cuts the connections of the key switched from (serves sign in again with the new one)\n", res.ControlCurrent)
			}
			if len(res.NotYet) > 0 {
				fmt.Fprintf(c.stdout, "switched despite: %s - they cannot link until enrolled again\n", strings.Join(res.NotYet, ", "))
			}
		}
	})
}

// sayOperatorAnnounced says, beside a configuration broker-config wrote,
// that it names an operator's key announced, and what comes next.
func (c *cli) sayOperatorAnnounced(k *Keys) {
	next := k.Operator.operatorKeyAnnounced()
	if next == "" || c.json {
		return
	}
	c.warn("the configuration trusts the operator key announced (%s) beside the one in force (%s)", next, k.Operator.OperatorPublic())
	c.next("restart each server onto it, then: mesh-control operator-key rotate --switch" + c.dirFlag())
}

// operatorKeyRotate announces an operator's key (here: only a file is
// made, and nothing is signed with it), or asks serve to switch to it.
func (c *cli) operatorKeyRotate(switching, force bool) error {
	if !switching {
		if force {
			return errors.New("--force is for --switch: the announcement needs none")
		}
		res, err := AnnounceOperatorKey(c.dir)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(res)
		}
		fmt.Fprintf(c.stdout, "operator key %s announced beside %s: nothing is signed with it yet\n", res.Next, res.Current)
		c.next("mesh-control broker-config" + c.dirFlag() + " --resolver ... > FILE    # the flags as before (a cluster: --out DIR): the servers' configuration names both keys; restart each server onto it, then: mesh-control operator-key rotate --switch")
		return nil
	}
	var res OperatorKeyResult
	return c.rotationStep(OperatorKeySubject, switching, force, &OperatorKeyRequest{Force: force}, &res, &res.Error, func() {
		fmt.Fprintf(c.stdout, "the operator's key is %s now; every account was pushed again signed by it (servers: %s)\n", res.Current, strings.Join(res.Servers, ", "))
		c.next("mesh-control broker-config" + c.dirFlag() + " --resolver ... > FILE    # the flags as before (a cluster: --out DIR): the configuration names the new key alone; restart each server onto it, and the old key is trusted no more")
	})
}
