module freetoken.example/decode

go 1.19

require freetoken v0.0.0

// The bindings from this source tree; a project of its own points this at its copy of
// bindings/go/freetoken.
replace freetoken => ../../bindings/go/freetoken
