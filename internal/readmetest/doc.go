// Package readmetest holds the README test: it takes every fenced block of
// the repository's README.md and runs it, parses it, or (where it needs
// something this machine lacks) checks what it can of it, so that README
// cannot drift from what vmgate does. Every block has a class in the
// test's table, a block without one fails the test, and a block that is
// known not to work as written is listed with the issue finding that
// fixes it; the test fails when such a block starts working, so that its
// entry is removed. The package has no code outside its tests.
package readmetest
