// tests/support/pch.cc
//
// The translation unit that builds the tests' precompiled header (tests/CMakeLists.txt,
// DSV41_TEST_PCH); every test executable reuses it. It defines nothing.
