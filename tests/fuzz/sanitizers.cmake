# Compile flags of the fuzz build (TESSERA_FUZZ=ON): included by the top CMakeLists.txt before the
# layer libraries, so everything the fuzz targets call is instrumented for coverage
# (-fsanitize=fuzzer-no-link) and checked by ASan and UBSan. Clang only; a separate build dir.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "TESSERA_FUZZ needs clang (libFuzzer): configure a separate build dir with "
                      "CC=clang CXX=clang++, or run scripts/fuzz.sh, which does")
endif()
# UBSan findings abort (a crash libFuzzer keeps) instead of printing and going on; libstdc++'s
# assertions bounds-check operator[] of vector, string, span and friends. (Instrumented loops do not
# vectorize: -Wno-pass-failed silences the "#pragma omp simd not vectorized" notes.)
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -D_GLIBCXX_ASSERTIONS
                    -fno-omit-frame-pointer -g -Wno-pass-failed)
add_link_options(-fsanitize=address,undefined)
