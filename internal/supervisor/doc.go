// Package supervisor runs agentd's children: it starts them in order, restarts the ones that
// exit with backoff, swaps a child's binary without dropping its sockets, and stops them in
// reverse order.
package supervisor
