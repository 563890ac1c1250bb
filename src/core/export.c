// libvllm.so is vllm_static linked whole, with libvllm.map keeping only the
// vllm_* symbols visible. This file exists because a library needs a source.
#include "vllm.h"
