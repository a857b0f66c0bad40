package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
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
	}
	cl, err := c.connect()
	if err != nil {
		return err
	}
	defer cl.Close()
	data, _ := json.Marshal(&RotateRequest{RecoveryKeyFile: recoveryKey})
	m, err := cl.NC.Request(KeysSubject, data, 10*time.Minute)
	if errors.Is(err, nats.ErrNoResponders) {
		return errors.New("no serve answers on the broker: the rotation is serve's to carry out (it holds the key it signs with); start mesh-control serve")
	}
	if err != nil {
		return fmt.Errorf("asking serve for the rotation: %w", err)
	}
	var res RotateResult
	if err := json.Unmarshal(m.Data, &res); err != nil {
		return fmt.Errorf("serve's answer does not decode: %w", err)
	}
	if c.json {
		if err := c.printJSON(&res); err != nil {
			return err
		}
	} else if res.To != "" && res.Error == "" {
		how := "signed by the key retired and by the new one"
		if res.By == "recovery" {
			how = "signed by the recovery key and by the new one"
		}
		fmt.Fprintf(c.stdout, "control key %s rotated to %s (rotation %d, %s): announced to %d node(s); %d signed again by the new key\n",
			res.From, res.To, res.Seq, how, res.Nodes, res.Republished)
		if len(res.Held) > 0 {
			fmt.Fprintf(c.stdout, "held, their newest declaration holding sealed content: %s — each takes the rotation with its next declaration\n", strings.Join(res.Held, ", "))
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
