package shapes

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
)

// The name checks are hand-written sets rather than regular expressions:
// compiling eight regexps cost the rescue command a millisecond at every
// start, for checks this simple.
var (
	// nameRe is a user, group, container or network name.
	nameRe = newCharset("A-Za-z0-9_", "A-Za-z0-9_.-", 1, 64)
	// unitRe is a systemd-style unit name (also what OpenRC, runit and s6 use).
	unitRe = newCharset(`A-Za-z0-9:_.\\@-`, `A-Za-z0-9:_.\\@-`, 1, 255)
	// packageRe covers dpkg, apk and pacman package names.
	packageRe = newCharset("A-Za-z0-9", "A-Za-z0-9+._@-", 1, 128)
	// versionRe covers dpkg, apk and pacman version strings.
	versionRe = newCharset("A-Za-z0-9", "A-Za-z0-9+.:~_-", 1, 128)
	ifaceRe   = newCharset("A-Za-z0-9_-", "A-Za-z0-9_-", 1, 15)
	envKeyRe  = newCharset("A-Za-z_", "A-Za-z0-9_", 1, 1<<16)
	hexRe     = newCharset("0-9a-f", "0-9a-f", 64, 64)
)

// charset matches a string whose first byte is in one set, the rest in
// another, of a length between min and max.
type charset struct {
	first, rest [256]bool
	min, max    int
}

// newCharset builds a charset from specs such as "A-Za-z0-9_-": ranges
// written a-b, and single bytes (a '-' last is itself).
func newCharset(first, rest string, min, max int) *charset {
	c := &charset{min: min, max: max}
	fill := func(t *[256]bool, spec string) {
		for i := 0; i < len(spec); i++ {
			if i+2 < len(spec) && spec[i+1] == '-' {
				for b := int(spec[i]); b <= int(spec[i+2]); b++ {
					t[b] = true
				}
				i += 2
				continue
			}
			t[spec[i]] = true
		}
	}
	fill(&c.first, first)
	fill(&c.rest, rest)
	return c
}

// MatchString reports whether s is in the set.
func (c *charset) MatchString(s string) bool {
	if len(s) < c.min || len(s) > c.max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if i == 0 && !c.first[s[0]] || i > 0 && !c.rest[s[i]] {
			return false
		}
	}
	return true
}

// pinnedImage reports whether an image reference ends in @sha256:<64 hex>.
func pinnedImage(s string) bool {
	i := strings.LastIndex(s, "@sha256:")
	return i >= 0 && hexRe.MatchString(s[i+len("@sha256:"):])
}

// isIdent reports whether s is a module or id: 1 to 64 of letters,
// digits, _ and -, starting with a letter or digit, and no dot, because
// "module.id" is how one resource names another. (Checked by hand: it runs
// twice per resource.)
func isIdent(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// validator collects the context of one declaration's validation.
type validator struct {
	d           *Declaration
	allowAction bool
	r           Resource       // the resource being validated
	err         *Error         // the first error
	files       map[ident]bool // every identity; true for a file
}

// ident is a resource's identity, module and id, as a map key: the same as
// Key() without building the string, for every resource of every apply.
type ident struct{ module, id string }

func (v *validator) fail(field, format string, args ...any) {
	if v.err != nil {
		return
	}
	e := &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
	if v.r != nil {
		e.Resource, e.Type = v.r.Head().Key(), v.r.Head().Type
	}
	v.err = e
}

// failAs is fail for a refusal that is an instance of sentinel.
func (v *validator) failAs(sentinel error, field, format string, args ...any) {
	if v.err != nil {
		return
	}
	v.fail(field, format, args...)
	v.err.Err = sentinel
}

func (d *Declaration) validate(allowAction bool) error {
	v := &validator{d: d, allowAction: allowAction}
	if len(d.Resources) == 0 && !d.OwnsNothing {
		v.fail("resources", "empty without \"owns_nothing\": true; emptiness is never read from a declaration that may be truncated")
	}
	if len(d.Resources) > 0 && d.OwnsNothing {
		v.fail("owns_nothing", "set on a declaration that holds %d resources", len(d.Resources))
	}
	if d.Retire && !d.OwnsNothing {
		v.fail("retire", "only with \"owns_nothing\": true; a node retires holding nothing")
	}
	for _, m := range d.Taken {
		if !isIdent(m) {
			v.fail("taken", "%q is not a module name", m)
		}
	}
	if len(d.Node) > 128 || len(d.Enrolment) > 128 {
		v.fail("node", "node and enrolment are at most 128 bytes")
	}
	// seen is every identity, true for a file (what restart_on may name).
	seen := make(map[ident]bool, len(d.Resources))
	v.files = seen
	for _, r := range d.Resources {
		b := r.Head()
		if !isIdent(b.Module) {
			v.r = r
			v.fail("module", "%q is not a module name (letters, digits, _ and -, no dot)", b.Module)
		}
		if !isIdent(b.ID) {
			v.r = r
			v.fail("id", "%q is not an id (letters, digits, _ and -, no dot)", b.ID)
		}
		id := ident{b.Module, b.ID}
		if _, dup := seen[id]; dup {
			v.r = r
			v.fail("id", "declared twice; a resource's module and id are its identity")
		}
		// restart_on may name a file, a region or keys: what changes a
		// configuration the unit reads.
		switch r.(type) {
		case *File, *Region, *Keys:
			seen[id] = true
		default:
			seen[id] = false
		}
	}
	targets := make(map[[2]string]Resource, len(d.Resources))
	for _, r := range d.Resources {
		v.r = r
		if _, isAction := r.(*Action); isAction && !allowAction {
			v.failAs(ErrAction, "type", "%v", ErrAction)
		}
		r.validate(v)
		if kind, name := targetOf(r); kind != "" && v.err == nil {
			t := [2]string{kind, name}
			if other, dup := targets[t]; dup {
				v.fail("", "%s:%s is also declared by %s; one thing on the machine has one declaration", kind, name, other.Head().Key())
			}
			targets[t] = r
		}
		if v.err == nil {
			checkProtected(v, r, nil)
		}
		if v.err != nil {
			return v.err
		}
	}
	if v.err != nil {
		return v.err
	}
	if v.sharedFiles(d.Resources); v.err != nil {
		return v.err
	}
	return nil
}

// sharedFiles checks what a declaration writes into shared files: a file
// declared whole is not also edited (region, keys), a file is not both a
// region's and keys', keys of one file are read in one format, and no key
// is set by two resources.
func (v *validator) sharedFiles(rs []Resource) {
	whole := map[string]Resource{}
	edited := map[string]Resource{}
	type keyAt struct{ path, key string }
	keys := map[keyAt]Resource{}
	for _, r := range rs {
		switch x := r.(type) {
		case *File:
			whole[x.Path] = r
		case *Directory:
			whole[x.Path] = r
		}
	}
	for _, r := range rs {
		var p string
		switch x := r.(type) {
		case *Region:
			p = x.Path
		case *Keys:
			p = x.Path
		default:
			continue
		}
		v.r = r
		if w, ok := whole[p]; ok {
			v.fail("path", "%s is declared whole by %s; a file the mesh writes whole is not also edited in place", p, w.Head().Key())
			return
		}
		if o, ok := edited[p]; ok && o.Head().Type != r.Head().Type {
			v.fail("path", "%s is edited as a %s by %s too; one shared file takes regions or keys, not both", p, o.Head().Type, o.Head().Key())
			return
		}
		if o, ok := edited[p]; ok && r.Head().Type == TypeKeys && o.(*Keys).Format != r.(*Keys).Format {
			v.fail("format", "%s is read in the %s format by %s; one file has one format", p, o.(*Keys).Format, o.Head().Key())
			return
		}
		edited[p] = r
		if k, ok := r.(*Keys); ok {
			for name := range k.Set {
				at := keyAt{p, name}
				if k.Format == "space" {
					at.key = strings.ToLower(name)
				}
				if o, dup := keys[at]; dup {
					v.fail("set", "%s in %s is set by %s too; one key has one declaration", name, p, o.Head().Key())
					return
				}
				keys[at] = r
			}
		}
	}
}

// Target names the thing on the machine a resource manages, such as
// "path:/etc/motd" or "service:sshd.service". Two resources may not manage
// the same thing. An action manages nothing nameable and returns "".
func Target(r Resource) string {
	kind, name := targetOf(r)
	if kind == "" {
		return ""
	}
	return kind + ":" + name
}

// targetOf is Target in its two parts, kind and name, so that validation
// compares targets without building a string for each.
func targetOf(r Resource) (kind, name string) {
	switch r := r.(type) {
	case *File:
		return "path", r.Path
	case *Directory:
		return "path", r.Path
	case *Service:
		return "service", NormaliseUnit(r.Unit)
	case *Package:
		return "package", r.Name
	case *User:
		return "user", r.Name
	case *Archive:
		return "archive", r.Destination
	case *Container:
		return "container", r.Name
	case *Network:
		return "network", r.Name
	case *Overlay:
		return "overlay", r.Interface
	case *Opening:
		return "opening", fmt.Sprintf("%s/%d/%s/%s", r.Path, r.Port, r.Protocol, r.From)
	case *Region:
		return "region", r.Path + "#" + r.Key()
	case *Keys:
		return "keys", r.Path + "#" + r.Key()
	case *Process:
		// The unit it is, so a service of the same unit is one thing
		// declared twice.
		return "service", NormaliseUnit(r.Name)
	}
	return "", ""
}

// EditTarget splits the target of a region or keys resource,
// "region:<path>#<module.id>", into the file and the resource's name.
func EditTarget(target string) (kind, path, name string, ok bool) {
	kind, rest, ok := strings.Cut(target, ":")
	i := strings.LastIndexByte(rest, '#')
	if !ok || i < 0 || (kind != "region" && kind != "keys") {
		return "", "", "", false
	}
	return kind, rest[:i], rest[i+1:], true
}

func (v *validator) path(field, p string) {
	switch {
	case p == "":
		v.fail(field, "missing; an absolute path")
	case strings.ContainsRune(p, 0):
		v.fail(field, "contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		v.fail(field, "%q is not absolute", p)
	case !isCleanAbs(p):
		v.fail(field, "%q is not clean (it would be %q)", p, path.Clean(p))
	case p == "/":
		v.fail(field, "the root directory is not a resource")
	case len(p) > 4096:
		v.fail(field, "longer than 4096 bytes")
	}
}

// isCleanAbs reports whether an absolute path is what path.Clean would
// make of it (no empty, "." or ".." component, no trailing slash), without
// building the cleaned copy for each of a thousand paths.
func isCleanAbs(p string) bool {
	if p == "/" {
		return true
	}
	return !strings.Contains(p, "//") && !strings.Contains(p, "/./") && !strings.Contains(p, "/../") &&
		!strings.HasSuffix(p, "/") && !strings.HasSuffix(p, "/.") && !strings.HasSuffix(p, "/..")
}

func (v *validator) mode(field, m string) {
	if m == "" {
		return
	}
	if _, ok := ParseMode(m); !ok {
		v.fail(field, "%q is not an octal mode such as \"0644\" (3 or 4 octal digits, at most 7777)", m)
	}
}

// owner accepts "user", "user:group", or numeric ids in either place.
func (v *validator) owner(field, o string) {
	if o == "" {
		return
	}
	u, g, hasGroup := strings.Cut(o, ":")
	if !nameRe.MatchString(u) || (hasGroup && !nameRe.MatchString(g)) {
		v.fail(field, "%q is not \"user\", \"user:group\" or numeric ids", o)
	}
}

func (v *validator) argv(field string, a []string) {
	if len(a) == 0 {
		v.fail(field, "missing; an argument vector such as [\"/usr/bin/true\"]")
		return
	}
	if a[0] == "" {
		v.fail(field, "the program (first element) is empty")
	}
	for _, s := range a {
		if strings.ContainsRune(s, 0) {
			v.fail(field, "an argument contains a NUL byte")
		}
	}
}

func (v *validator) base64(field, s string) {
	if _, err := base64.StdEncoding.DecodeString(s); err != nil {
		v.fail(field, "not standard base64: %v", err)
	}
}

func (f *File) validate(v *validator) {
	v.path("path", f.Path)
	n := 0
	for _, p := range []*string{f.Content, f.Bytes, f.Sealed} {
		if p != nil {
			n++
		}
	}
	if n != 1 {
		v.fail("content", "a file says what is in it exactly once: one of content, bytes or sealed (found %d)", n)
	}
	if f.Bytes != nil {
		v.base64("bytes", *f.Bytes)
	}
	if f.Sealed != nil {
		v.base64("sealed", *f.Sealed)
	}
	v.mode("mode", f.Mode)
	v.owner("owner", f.Owner)
}

func (d *Directory) validate(v *validator) {
	v.path("path", d.Path)
	v.mode("mode", d.Mode)
	v.owner("owner", d.Owner)
}

func (a *Action) validate(v *validator) {
	v.argv("run", a.Run)
	v.argv("verify", a.Verify)
	if a.Timeout < 0 || a.Timeout > MaxActionTimeout {
		v.fail("timeout", "%d is out of range 1..%d seconds (0 means %d)", a.Timeout, MaxActionTimeout, DefaultActionTimeout)
	}
}

func (s *Service) validate(v *validator) {
	if !unitRe.MatchString(s.Unit) {
		v.fail("unit", "%q is not a unit name", s.Unit)
	}
	switch s.State {
	case "", "running", "stopped":
	default:
		v.fail("state", "%q is not one of running, stopped (or unset: the mesh must not start it)", s.State)
	}
	for _, ref := range s.RestartOn {
		key := ident{s.Module, ref}
		if m, id, ok := strings.Cut(ref, "."); ok {
			key = ident{m, id}
		}
		if !v.files[key] {
			v.fail("restart_on", "%q names no file, region or keys in this declaration (\"id\" is one of module %s, \"module.id\" of another)", ref, s.Module)
		}
	}
}

func (p *Package) validate(v *validator) {
	if !packageRe.MatchString(p.Name) {
		v.fail("name", "%q is not a package name", p.Name)
	}
	if p.Version != "" && !versionRe.MatchString(p.Version) {
		v.fail("version", "%q is not a package version", p.Version)
	}
}

func (u *User) validate(v *validator) {
	if !nameRe.MatchString(u.Name) {
		v.fail("name", "%q is not a user name", u.Name)
	}
	if u.Shell != "" {
		v.path("shell", u.Shell)
	}
	if u.Home != "" {
		v.path("home", u.Home)
	}
	for _, g := range u.Groups {
		if !nameRe.MatchString(g) {
			v.fail("groups", "%q is not a group name", g)
		}
	}
}

func (a *Archive) validate(v *validator) {
	if a.URL == "" || strings.ContainsAny(a.URL, " \n\x00") {
		v.fail("url", "missing or not a URL")
	}
	if len(a.SHA256) != 64 || strings.ToLower(a.SHA256) != a.SHA256 {
		v.fail("sha256", "%q is not 64 lower-case hex digits", a.SHA256)
	} else if _, err := hex.DecodeString(a.SHA256); err != nil {
		v.fail("sha256", "%q is not 64 lower-case hex digits", a.SHA256)
	}
	v.path("destination", a.Destination)
}

// CheckURL refuses a URL an archive does not come by. There are two: the
// control side's object store, which keeps an archive under its digest
// (mesh-control archive put prints obj://<sha256>), so an obj:// URL
// naming another is refused wherever it went; and a file the executor
// reads as root, named by a clean absolute path (file://host/PATH and
// file://PATH would be read relative to the executor's working
// directory). Not a rule of the parse: a target an earlier release saved
// is read again at every reconcile, and one such URL must fail its own
// step (the executor's archive step checks it), not the whole target;
// the control side checks it before it signs.
func (a *Archive) CheckURL() error {
	if name, ok := strings.CutPrefix(a.URL, "obj://"); ok && name != a.SHA256 {
		return fmt.Errorf("archive %s: url %q is not obj:// and the archive's sha256: the control side stores an archive under its digest (mesh-control archive put prints its URL)", a.Key(), a.URL)
	} else if p, ok := strings.CutPrefix(a.URL, "file://"); ok && (!path.IsAbs(p) || path.Clean(p) != p) {
		return fmt.Errorf("archive %s: url %q is not file:// and a clean absolute path (file:///PATH; a host part, as in file://host/PATH, is not taken)", a.Key(), a.URL)
	} else if !ok && !strings.HasPrefix(a.URL, "obj://") {
		return fmt.Errorf("archive %s: url %q is neither obj://<sha256> (an archive the control side stores) nor file:///PATH (a file on the machine, from a local file or the bundle)", a.Key(), a.URL)
	}
	return nil
}

// CheckLinkURL is CheckURL for a declaration over the link, which names an
// archive the control side stores (obj://) alone: a file:// URL names a
// file on the machine, which a local file or the bundle may, as root
// wrote them.
func (a *Archive) CheckLinkURL() error {
	if err := a.CheckURL(); err != nil {
		return err
	}
	if !strings.HasPrefix(a.URL, "obj://") {
		return fmt.Errorf("archive %s: url %q: a file:// archive may come from a local file or the bundle, not over the link (store it: mesh-control archive put, and name obj://<sha256>)", a.Key(), a.URL)
	}
	return nil
}

func (c *Container) validate(v *validator) {
	if !nameRe.MatchString(c.Name) {
		v.fail("name", "%q is not a container name", c.Name)
	}
	if !pinnedImage(c.Image) {
		v.fail("image", "%q is not pinned by digest (…@sha256:<64 hex>)", c.Image)
	}
	for k := range c.Env {
		if !envKeyRe.MatchString(k) {
			v.fail("env", "%q is not an environment variable name", k)
		}
	}
	for _, p := range c.Ports {
		if _, _, _, ok := ParsePort(p); !ok {
			v.fail("ports", "%q is not \"[ip:]host:container[/tcp|udp]\"", p)
		}
	}
	for _, m := range c.Mounts {
		src, dst, _, ok := ParseMount(m)
		if !ok {
			v.fail("mounts", "%q is not \"source:target[:ro]\" with an absolute target", m)
			continue
		}
		if strings.HasPrefix(src, "/") {
			v.path("mounts", src)
		}
		v.path("mounts", dst)
	}
	if c.Network != "" && !nameRe.MatchString(c.Network) {
		v.fail("network", "%q is not a network name", c.Network)
	}
}

// ParsePort splits "[ip:]host:container[/proto]".
func ParsePort(s string) (hostIP string, host, container int, ok bool) {
	spec, proto, hasProto := strings.Cut(s, "/")
	if hasProto && proto != "tcp" && proto != "udp" {
		return "", 0, 0, false
	}
	parts := strings.Split(spec, ":")
	if len(parts) == 3 {
		if _, err := netip.ParseAddr(parts[0]); err != nil {
			return "", 0, 0, false
		}
		hostIP, parts = parts[0], parts[1:]
	}
	if len(parts) != 2 {
		return "", 0, 0, false
	}
	h, err1 := strconv.Atoi(parts[0])
	c, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || h < 1 || h > 65535 || c < 1 || c > 65535 {
		return "", 0, 0, false
	}
	return hostIP, h, c, true
}

// ParseMount splits "source:target[:ro]".
func ParseMount(s string) (source, target string, readOnly, ok bool) {
	parts := strings.Split(s, ":")
	switch {
	case len(parts) == 3 && parts[2] == "ro":
		readOnly = true
	case len(parts) == 3 && parts[2] == "rw":
	case len(parts) == 2:
	default:
		return "", "", false, false
	}
	source, target = parts[0], parts[1]
	if source == "" || !strings.HasPrefix(target, "/") {
		return "", "", false, false
	}
	if !strings.HasPrefix(source, "/") && !nameRe.MatchString(source) {
		return "", "", false, false
	}
	return source, target, readOnly, true
}

func (n *Network) validate(v *validator) {
	if !nameRe.MatchString(n.Name) {
		v.fail("name", "%q is not a network name", n.Name)
	}
}

// IsInterfaceName says whether name is a network interface name an
// overlay may declare.
func IsInterfaceName(name string) bool { return ifaceRe.MatchString(name) }

func (o *Overlay) validate(v *validator) {
	if !ifaceRe.MatchString(o.Interface) {
		v.fail("interface", "%q is not an interface name (at most 15 of letters, digits, _ and -)", o.Interface)
	}
	if _, err := netip.ParsePrefix(o.Address); err != nil {
		v.fail("address", "%q is not an address with prefix length, such as 10.44.0.3/16", o.Address)
	}
	if o.ListenPort < 0 || o.ListenPort > 65535 {
		v.fail("listen_port", "%d is out of range 0..65535", o.ListenPort)
	}
	if o.Roster && len(o.Peers) > 0 {
		v.fail("peers", "declared beside roster: the peers are the roster's; declare either")
	}
	if o.RosterMin != 0 && !o.Roster {
		v.fail("roster_min", "set without roster: it bounds the sequence of the roster the peers are taken from")
	}
	for i, p := range o.Peers {
		field := fmt.Sprintf("peers[%d]", i)
		if !IsWireGuardKey(p.PublicKey) {
			v.fail(field+".public_key", "not a base64 WireGuard public key (32 bytes)")
		}
		if p.Endpoint != "" {
			if _, err := netip.ParseAddrPort(p.Endpoint); err != nil {
				v.fail(field+".endpoint", "%q is not address:port", p.Endpoint)
			}
		}
		if len(p.AllowedIPs) == 0 {
			v.fail(field+".allowed_ips", "missing; a peer with no allowed addresses carries nothing")
		}
		for _, a := range p.AllowedIPs {
			if _, err := netip.ParsePrefix(a); err != nil {
				v.fail(field+".allowed_ips", "%q is not a prefix", a)
			}
		}
		if p.Keepalive < 0 || p.Keepalive > 65535 {
			v.fail(field+".keepalive", "%d is out of range 0..65535 seconds", p.Keepalive)
		}
	}
}

// MaxRegionContent bounds a region's block.
const MaxRegionContent = 1 << 20

func (g *Region) validate(v *validator) {
	v.path("path", g.Path)
	switch {
	case g.Content == nil:
		v.fail("content", "missing; the block's lines (\"\" for an empty block)")
		return
	case len(g.Text()) > MaxRegionContent:
		v.fail("content", "%d bytes, over the limit of %d", len(g.Text()), MaxRegionContent)
	case strings.ContainsRune(g.Text(), 0):
		v.fail("content", "holds a NUL byte; a region is lines of text")
	}
	for i, l := range strings.Split(g.Text(), "\n") {
		if _, name, ok := ParseRegionMarker([]byte(l)); ok {
			v.fail("content", "line %d is a region's marker (%s): one file must not read two ways", i+1, name)
			break
		}
	}
	if c := g.Comment; c != "" && (len(c) > MaxRegionComment || strings.ContainsAny(c, " \t\r\n\x00")) {
		v.fail("comment", "%q is not a comment leader (1 to %d bytes, no blank): \"#\", \"//\", \";\"", c, MaxRegionComment)
	}
}

// MaxKeys bounds the keys one resource sets.
const MaxKeys = 256

func (k *Keys) validate(v *validator) {
	v.path("path", k.Path)
	space := k.Format == "space"
	if k.Format != "equals" && !space {
		v.fail("format", "%q is not one of equals (key = value), space (Key value)", k.Format)
		return
	}
	if len(k.Set) == 0 || len(k.Set) > MaxKeys {
		v.fail("set", "%d keys; a keys resource sets 1 to %d", len(k.Set), MaxKeys)
		return
	}
	folded := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(k.Set)) {
		if !ValidKeyName(name) {
			v.fail("set", "%q is not a key (letters, digits and ._-/, at most 128 bytes)", name)
			return
		}
		if !ValidKeyValue(k.Set[name], space) {
			v.fail("set", "the value of %s is not one line of at most 4096 bytes without blanks at its ends (nor empty, in the space format)", name)
			return
		}
		if space && strings.EqualFold(name, "Match") {
			// Not a key: it starts a block that every line after it
			// belongs to (sshd_config), and the space format sets only
			// the global part's keys, before the first Match.
			v.fail("set", "%s starts a conditional block, not a key; the space format sets only the keys before the file's first Match line (write the block with a region)", name)
			return
		}
		if space {
			if o, dup := folded[strings.ToLower(name)]; dup {
				v.fail("set", "%s and %s are one key in the space format (sshd compares keys without case)", o, name)
				return
			}
			folded[strings.ToLower(name)] = name
		}
	}
}

// processWord is what a process's command line, environment values and
// user may hold: no blank, quote, $, % or backslash, so that no init's
// format (a systemd unit, an OpenRC script, a run script) quotes or
// expands any of it. A value that needs more goes in a file the program
// reads.
var (
	processWord = newCharset("A-Za-z0-9_./:=@+,-", "A-Za-z0-9_./:=@+,-", 1, 1024)
	processName = newCharset("A-Za-z0-9_@-", "A-Za-z0-9_@-", 1, 64)
	envName     = newCharset("A-Za-z_", "A-Za-z0-9_", 1, 128)
	userName    = newCharset("a-z_", "a-z0-9_-", 1, 32)
)

// MaxProcessWords bounds a process's command line and environment.
const MaxProcessWords = 64

func (p *Process) validate(v *validator) {
	if !processName.MatchString(p.Name) {
		v.fail("name", "%q is not a process's name (letters, digits, _, - and @; no dot: the unit is NAME.service, /etc/init.d/NAME, /etc/sv/NAME)", p.Name)
	}
	switch {
	case len(p.Exec) == 0 || len(p.Exec) > MaxProcessWords:
		v.fail("exec", "%d words; a command line is 1 to %d", len(p.Exec), MaxProcessWords)
		return
	case !strings.HasPrefix(p.Exec[0], "/") || !isCleanAbs(p.Exec[0]) || p.Exec[0] == "/":
		v.fail("exec", "%q: the program is an absolute, clean path", p.Exec[0])
	}
	for _, w := range p.Exec {
		if !processWord.MatchString(w) {
			v.fail("exec", "%q holds a character an init's definition would quote or expand (only letters, digits and _./:=@+,-): put such values in a file the program reads", w)
			return
		}
	}
	switch {
	case !userName.MatchString(p.User):
		v.fail("user", "%q is not a user's name (a process runs as a named user)", p.User)
	case p.User == "root":
		v.fail("user", "a process the mesh runs is never root: name the user it runs as")
	}
	if len(p.Env) > MaxProcessWords {
		v.fail("env", "%d variables; at most %d", len(p.Env), MaxProcessWords)
	}
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		if !envName.MatchString(k) {
			v.fail("env", "%q is not a variable's name", k)
			return
		}
		if val := p.Env[k]; val != "" && !processWord.MatchString(val) {
			v.fail("env", "the value of %s holds a character an init's definition would quote or expand (only letters, digits and _./:=@+,-)", k)
			return
		}
	}
	switch p.State {
	case "", "running", "stopped":
	default:
		v.fail("state", "%q is not one of running, stopped (unset: running)", p.State)
	}
}

func (o *Opening) validate(v *validator) {
	if o.Port < 1 || o.Port > 65535 {
		v.fail("port", "%d is out of range 1..65535", o.Port)
	}
	if o.Protocol != "tcp" && o.Protocol != "udp" {
		v.fail("protocol", "%q is not one of tcp, udp", o.Protocol)
	}
	if o.From != "" {
		if _, err := netip.ParsePrefix(o.From); err != nil {
			if _, err := netip.ParseAddr(o.From); err != nil {
				v.fail("from", "%q is not an address or prefix (unset means from anywhere)", o.From)
			}
		}
	}
	if o.Path != "incoming" && o.Path != "forwarded" {
		v.fail("path", "%q is not one of incoming, forwarded", o.Path)
	}
}
