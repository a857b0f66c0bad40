package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/executor/command"
)

// owner is a resolved "user[:group]".
type owner struct {
	uid, gid int
}

// owners resolves names through the system's name service (getent), so a
// user from LDAP or systemd's dynamic users resolves as the machine sees
// it. Numeric ids pass through; a bare numeric uid N means N:N, and a bare
// name means the user and its primary group. Results are cached for one
// apply.
type owners struct {
	users  map[string][2]int // name -> uid, primary gid
	groups map[string]int
	getent func(db, key string) ([]string, error)
}

// newOwners resolves through lookup, the name service's getent when nil.
func newOwners(lookup func(db, key string) ([]string, error)) *owners {
	if lookup == nil {
		lookup = getent
	}
	return &owners{users: map[string][2]int{}, groups: map[string]int{}, getent: lookup}
}

func (o *owners) resolve(spec string) (owner, error) {
	u, g, hasGroup := strings.Cut(spec, ":")
	var out owner
	if n, err := strconv.Atoi(u); err == nil {
		out.uid, out.gid = n, n
	} else {
		ent, err := o.user(u)
		if err != nil {
			return out, err
		}
		out.uid, out.gid = ent[0], ent[1]
	}
	if hasGroup {
		if n, err := strconv.Atoi(g); err == nil {
			out.gid = n
		} else {
			gid, err := o.group(g)
			if err != nil {
				return out, err
			}
			out.gid = gid
		}
	}
	return out, nil
}

func (o *owners) user(name string) ([2]int, error) {
	if ent, ok := o.users[name]; ok {
		return ent, nil
	}
	fields, err := o.getent("passwd", name)
	if err != nil {
		return [2]int{}, err
	}
	if len(fields) < 4 {
		return [2]int{}, fmt.Errorf("user %q: getent passwd gave %q", name, strings.Join(fields, ":"))
	}
	uid, err1 := strconv.Atoi(fields[2])
	gid, err2 := strconv.Atoi(fields[3])
	if err1 != nil || err2 != nil {
		return [2]int{}, fmt.Errorf("user %q: getent passwd gave non-numeric ids", name)
	}
	o.users[name] = [2]int{uid, gid}
	return o.users[name], nil
}

func (o *owners) group(name string) (int, error) {
	if gid, ok := o.groups[name]; ok {
		return gid, nil
	}
	fields, err := o.getent("group", name)
	if err != nil {
		return 0, err
	}
	if len(fields) < 3 {
		return 0, fmt.Errorf("group %q: getent group gave %q", name, strings.Join(fields, ":"))
	}
	gid, err := strconv.Atoi(fields[2])
	if err != nil {
		return 0, fmt.Errorf("group %q: getent group gave a non-numeric id", name)
	}
	o.groups[name] = gid
	return gid, nil
}

// getentTimeout bounds one question to the name service.
const getentTimeout = 10 * time.Second

// getent asks the name service for one entry. Exit status 2 is "not found".
func getent(db, key string) ([]string, error) {
	argv := []string{"getent", db, key}
	res, err := command.Run(context.Background(), argv, command.Options{Timeout: getentTimeout})
	switch {
	case err != nil:
		return nil, err
	case res.Code == 2:
		what := "user"
		if db == "group" {
			what = "group"
		}
		return nil, fmt.Errorf("%s %q is not known to the name service (getent %s %s)", what, key, db, key)
	case res.Code != 0:
		return nil, fmt.Errorf("running %q failed: exit status %d\n%s", argv, res.Code, res.Stderr)
	}
	line, _, _ := strings.Cut(res.Stdout, "\n")
	return strings.Split(line, ":"), nil
}
