package agent_test

import (
	"net"
	"net/url"
	"strconv"
)

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

func splitHostPort(u string) (string, string, error) {
	p, err := url.Parse(u)
	if err != nil {
		return "", "", err
	}
	return net.SplitHostPort(p.Host)
}
