// Package archtest holds the repository's architecture rules as data, and
// the tests that check the whole tree against them: which package may
// import which (deps_test.go), how long a production function may be
// (funclen_test.go), which package-level variables may be exported
// (vars_test.go) and how large the packages and files under server/ may
// grow (size_test.go). docs/design.md explains the rules. The package has
// no code of its own.
package archtest
