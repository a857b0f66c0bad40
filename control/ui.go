package control

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nox-mesh/nox-mesh-host/link"
	"github.com/nox-mesh/nox-mesh-host/shapes"
)

// The status page (serve --ui ADDRESS): the page a person opens instead of
// reading tables. Every node — its state, when it was last heard, its
// versions, declared and applied, its last outcome, the lines of its last
// report and its briefing — and, a node's own page, the timeline of its
// reports. Read-only: it answers GET alone, has no form, no script, and
// writes nothing; it is served on the address given (loopback is the
// expected one) and reads the registry as `mesh-control nodes` does.

//go:embed ui/*.html
var uiFiles embed.FS

var uiPages = template.Must(template.New("").Funcs(template.FuncMap{
	"ago":     uiAgo,
	"outcome": outcomeClass,
	"time":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"trigger": triggerWord,
	// An apply's lines counted as reports and --wait count them.
	"tally": func(lines []shapes.Line) string { return tallyOf(lines).String() },
}).ParseFS(uiFiles, "ui/*.html"))

// uiAgo says how long ago t was, as nodes does.
func uiAgo(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return ago(t)
}

// outcomeClass is the CSS class of an outcome: what it means for a person
// looking, not its colour.
func outcomeClass(o shapes.Outcome) string {
	switch o {
	case shapes.Failed, shapes.Refused, shapes.HeldChanged:
		return "bad"
	case shapes.Applied, shapes.Repaired, shapes.Removed, shapes.Restored:
		return "changed"
	case shapes.Superseded, shapes.Held, shapes.Kept, shapes.Forgotten:
		return "note"
	}
	return "ok"
}

type uiServer struct {
	c   *Client
	log *slog.Logger
}

func (u *uiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "read-only: GET only", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	switch {
	case r.URL.Path == "/":
		u.overview(ctx, w)
	case strings.HasPrefix(r.URL.Path, "/node/"):
		u.node(ctx, w, strings.TrimPrefix(r.URL.Path, "/node/"))
	default:
		http.NotFound(w, r)
	}
}

func (u *uiServer) render(w http.ResponseWriter, page string, data any) {
	var b strings.Builder
	if err := uiPages.ExecuteTemplate(&b, page, data); err != nil {
		u.log.Warn("status page", "page", page, "err", err)
		http.Error(w, "the page could not be made: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprint(w, b.String())
}

// uiOverview is the overview page's data: the fleet at a glance in the
// words `mesh-control status` says it (Status, from readFleet and parts),
// then every node.
type uiOverview struct {
	Now    time.Time
	Status []statusPart
	Nodes  []*NodeStatus
	Error  string
}

func (u *uiServer) overview(ctx context.Context, w http.ResponseWriter) {
	data := uiOverview{Now: time.Now()}
	s, ns, err := readFleet(ctx, u.c)
	if err != nil {
		data.Error = err.Error()
	}
	slices.SortFunc(ns, func(a, b *NodeStatus) int { return strings.Compare(a.Name, b.Name) })
	data.Status, data.Nodes = s.parts(), ns
	u.render(w, "overview.html", data)
}

// uiNode is a node's page's data.
type uiNode struct {
	Now      time.Time
	Node     *NodeStatus
	Reports  []*SignedReport
	Unsigned int
	Error    string
}

func (u *uiServer) node(ctx context.Context, w http.ResponseWriter, name string) {
	ns, err := u.c.Nodes(ctx)
	if err != nil {
		u.render(w, "node.html", uiNode{Now: time.Now(), Error: "the registry could not be read: " + err.Error()})
		return
	}
	i := slices.IndexFunc(ns, func(n *NodeStatus) bool { return n.Name == name })
	if i < 0 {
		w.WriteHeader(http.StatusNotFound)
		u.render(w, "node.html", uiNode{Now: time.Now(), Error: fmt.Sprintf("no node %q in the registry", name)})
		return
	}
	data := uiNode{Now: time.Now(), Node: ns[i]}
	if data.Reports, data.Unsigned, err = u.c.Reports(ctx, name, 30); err != nil {
		data.Error = "its reports could not be read: " + err.Error()
	}
	slices.Reverse(data.Reports) // the newest first
	u.render(w, "node.html", data)
}

// serveUI serves the status page on ln until ctx ends.
func serveUI(ctx context.Context, ln net.Listener, c *Client, log *slog.Logger) error {
	log.Info("status page served", "address", "http://"+ln.Addr().String()+"/")
	return serveHTTP(ctx, ln, &uiServer{c: c, log: log}, log)
}

// triggerWord is how a report's trigger reads on the page.
func triggerWord(r link.Report) string {
	if r.Trigger == "" {
		return link.TriggerDeclaration
	}
	return r.Trigger
}
