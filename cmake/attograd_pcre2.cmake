# PCRE2 (libpcre2-dev, 8-bit) as an imported target, attograd::pcre2: GPT-2's
# pre-tokenizer needs Unicode's letter and number classes (train/data/bpe.cpp).
# Debian ships no CMake package for it, so the header and library are found
# by name; the exported package's config (attogradConfig.cmake) includes this
# file too.
if(NOT TARGET attograd::pcre2)
  find_path(ATTOGRAD_PCRE2_INCLUDE_DIR pcre2.h)
  find_library(ATTOGRAD_PCRE2_LIBRARY pcre2-8)
  if(NOT ATTOGRAD_PCRE2_INCLUDE_DIR OR NOT ATTOGRAD_PCRE2_LIBRARY)
    message(FATAL_ERROR "PCRE2 (pcre2.h, libpcre2-8) is not found: install libpcre2-dev (.ci/install-deps does)")
  endif()
  add_library(attograd::pcre2 INTERFACE IMPORTED)
  set_target_properties(attograd::pcre2 PROPERTIES INTERFACE_LINK_LIBRARIES "${ATTOGRAD_PCRE2_LIBRARY}"
                                                   INTERFACE_INCLUDE_DIRECTORIES "${ATTOGRAD_PCRE2_INCLUDE_DIR}")
endif()
