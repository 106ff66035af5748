# FindXxhash: libxxhash (Debian's libxxhash-dev) as the imported target Xxhash::Xxhash.
find_path(Xxhash_INCLUDE_DIR xxhash.h)
find_library(Xxhash_LIBRARY NAMES xxhash)
include(${CMAKE_CURRENT_LIST_DIR}/ZeroImportedLibrary.cmake)
zero_imported_library(Xxhash)
