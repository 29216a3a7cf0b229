// Package supervisor runs agentd's children: it starts them (each after the children it
// depends on), restarts the ones that exit with backoff, swaps a child's binary without
// dropping its sockets, and stops them in reverse order.
package supervisor
