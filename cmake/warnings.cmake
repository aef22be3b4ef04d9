# Warnings and sanitizers, applied per target through retroinfer_options (an INTERFACE library).
add_library(retroinfer_options INTERFACE)
target_compile_options(retroinfer_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
if(RETROINFER_NATIVE)
  target_compile_options(retroinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
endif()
if(RETROINFER_SANITIZE AND RETROINFER_TSAN)
  message(FATAL_ERROR "RETROINFER_SANITIZE and RETROINFER_TSAN are exclusive")
endif()
if(RETROINFER_SANITIZE)
  target_compile_options(retroinfer_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(retroinfer_options INTERFACE -fsanitize=address,undefined)
endif()
if(RETROINFER_TSAN)
  target_compile_options(retroinfer_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -g>)
  target_link_options(retroinfer_options INTERFACE -fsanitize=thread)
endif()
