// Package agentv1 is version 1 of agentd's plugin contract: the Component service every helper
// serves, the Bus service agentd serves, and the helpers' typed configurations. Generated from
// the .proto files beside it by scripts/gen-proto.sh.
package agentv1
