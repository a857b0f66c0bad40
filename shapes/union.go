package shapes

import (
	"reflect"
	"strings"
	"sync"
)

// anyResource has every field of every shape, so a whole declaration is
// decoded in one pass of encoding/json. Which fields a resource may carry is
// then checked against its own shape (typeFields, by checkKeys), and it is
// copied into its shape. Field names and types are the shapes' own, and a
// test holds the two in step.
type anyResource struct {
	Base
	Path        string            `json:"path"`
	Content     *string           `json:"content"`
	Bytes       *string           `json:"bytes"`
	Sealed      *string           `json:"sealed" redact:"true"`
	Mode        string            `json:"mode"`
	Owner       string            `json:"owner"`
	Run         []string          `json:"run"`
	Verify      []string          `json:"verify"`
	Timeout     int               `json:"timeout"`
	Unit        string            `json:"unit"`
	State       string            `json:"state"`
	Enabled     *bool             `json:"enabled"`
	RestartOn   []string          `json:"restart_on"`
	Name        string            `json:"name"`
	Version     string            `json:"version"`
	Shell       string            `json:"shell"`
	Home        string            `json:"home"`
	Groups      []string          `json:"groups"`
	URL         string            `json:"url"`
	SHA256      string            `json:"sha256"`
	Destination string            `json:"destination"`
	Image       string            `json:"image"`
	Command     []string          `json:"command"`
	Env         map[string]string `json:"env"`
	Ports       []string          `json:"ports"`
	Mounts      []string          `json:"mounts"`
	Network     string            `json:"network"`
	Interface   string            `json:"interface"`
	Address     string            `json:"address"`
	ListenPort  int               `json:"listen_port"`
	Peers       []Peer            `json:"peers"`
	Roster      bool              `json:"roster"`
	RosterMin   uint64            `json:"roster_min"`
	Port        int               `json:"port"`
	Protocol    string            `json:"protocol"`
	From        string            `json:"from"`
	Comment     string            `json:"comment"`
	Format      string            `json:"format"`
	Set         map[string]string `json:"set"`
	Exec        []string          `json:"exec"`
	User        string            `json:"user"`
}

// shape copies u into its own shape; ok is false for an unknown type.
func (u *anyResource) shape() (Resource, bool) {
	b := u.Base
	switch u.Type {
	case TypeFile:
		return &File{Base: b, Path: u.Path, Content: u.Content, Bytes: u.Bytes, Sealed: u.Sealed, Mode: u.Mode, Owner: u.Owner}, true
	case TypeDirectory:
		return &Directory{Base: b, Path: u.Path, Mode: u.Mode, Owner: u.Owner}, true
	case TypeAction:
		return &Action{Base: b, Run: u.Run, Verify: u.Verify, Timeout: u.Timeout}, true
	case TypeService:
		return &Service{Base: b, Unit: u.Unit, State: u.State, Enabled: u.Enabled, RestartOn: u.RestartOn}, true
	case TypePackage:
		return &Package{Base: b, Name: u.Name, Version: u.Version}, true
	case TypeUser:
		return &User{Base: b, Name: u.Name, Shell: u.Shell, Home: u.Home, Groups: u.Groups}, true
	case TypeArchive:
		return &Archive{Base: b, URL: u.URL, SHA256: u.SHA256, Destination: u.Destination}, true
	case TypeContainer:
		return &Container{Base: b, Name: u.Name, Image: u.Image, Command: u.Command, Env: u.Env, Ports: u.Ports, Mounts: u.Mounts, Network: u.Network}, true
	case TypeNetwork:
		return &Network{Base: b, Name: u.Name}, true
	case TypeOverlay:
		return &Overlay{Base: b, Interface: u.Interface, Address: u.Address, ListenPort: u.ListenPort, Peers: u.Peers, Roster: u.Roster, RosterMin: u.RosterMin}, true
	case TypeOpening:
		return &Opening{Base: b, Port: u.Port, Protocol: u.Protocol, From: u.From, Path: u.Path}, true
	case TypeRegion:
		return &Region{Base: b, Path: u.Path, Content: u.Content, Comment: u.Comment}, true
	case TypeKeys:
		return &Keys{Base: b, Path: u.Path, Format: u.Format, Set: u.Set}, true
	case TypeProcess:
		return &Process{Base: b, Name: u.Name, Exec: u.Exec, User: u.User, Env: u.Env, State: u.State}, true
	}
	return nil, false
}

// typeFields is, for each shape, the JSON names of its fields. Only the
// slow path needs it (checkKeys): it is built by reflection on first use,
// not at every start.
var typeFields = sync.OnceValue(func() map[string]map[string]bool {
	m := map[string]map[string]bool{}
	for name, mk := range shapeTable {
		fields := map[string]bool{}
		var add func(t reflect.Type)
		add = func(t reflect.Type) {
			for t.Kind() == reflect.Pointer {
				t = t.Elem()
			}
			for i := 0; i < t.NumField(); i++ {
				f := t.Field(i)
				if f.Anonymous {
					add(f.Type)
					continue
				}
				n, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				fields[n] = true
			}
		}
		add(reflect.TypeOf(mk()))
		m[name] = fields
	}
	return m
})
