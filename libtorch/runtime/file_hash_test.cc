// SHA-256 of data and files against published digests (FIPS 180-2's
// examples and NIST's long message).

#include "libtorch/runtime/file_hash.h"

#include <cstdio>
#include <fstream>
#include <string>

#include <doctest/doctest.h>

#include "planner/base/error.h"

using namespace ckplan;

TEST_CASE("sha256 matches known digests") {
  CHECK(Sha256Hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(Sha256Hex(std::string(1000, 'a')) == "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
  CHECK(Sha256Hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // The 448-bit message: the padding takes a second block.
  CHECK(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_CASE("a file's sha256 is its bytes' (read in 64 KiB pieces), and a missing file is refused by name") {
  const std::string path = "file_hash_test.tmp.bin";
  std::string data(200000, 'a');  // over three pieces
  for (size_t i = 0; i < data.size(); i += 7) data[i] = static_cast<char>(i % 251);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  CHECK(Sha256File(path) == Sha256Hex(data));
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(Sha256File(path), doctest::Contains(path.c_str()), Error);
}
