package control

import (
	"context"
	"net/netip"
)

// Allocate is allocate, for a test that races the overlay's settings.
func (c *Client) Allocate(ctx context.Context, node string, network netip.Prefix) (netip.Addr, error) {
	return c.allocate(ctx, node, network)
}
