// fuzz_config.c - libFuzzer harness: the input is a NemotronH config.json
// (Python-flavoured JSON). It is refused with an error, or every size the
// model derives from it stays within models/config_reader.h's limits.
// Seeds (the fixtures' configs and variants) in tests/fuzz/corpus/config/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "models/config_reader.h"
#include "models/nemotron_h.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = NULL;
    if (json_parse_python((const char *)data, size, "fuzz/config.json", &j)) return 0;
    struct nh_config c;
    if (!nh_config_parse(j, "fuzz/config.json", &c)) {
        int64_t I = (int64_t)c.m_heads * c.m_head_dim, GN = (int64_t)c.m_groups * c.m_state;
        if (c.num_layers < 1 || c.num_layers > CFG_MAX_LAYERS || c.vocab < 1 || c.hidden < 1) abort();
        if (2 * I + 2 * GN + c.m_heads > CFG_MAX_WIDTH || (int64_t)c.vocab * c.hidden > CFG_MAX_MATRIX) abort();
        if ((int64_t)(c.heads + 2 * c.kv_heads) * c.head_dim > CFG_MAX_WIDTH) abort();
        if (!(c.eps > 0 && c.eps <= 1) || !(c.dt_min >= 0 && c.dt_min <= c.dt_max)) abort();
        if (c.num_eos < 0 || c.num_eos > 8) abort();
        for (int i = 0; i < c.num_eos; i++)
            if (c.eos[i] < 0 || c.eos[i] >= c.vocab) abort();
        for (int tp = 1; tp <= 4; tp *= 2) nh_config_check_tp(&c, tp, "fuzz/config.json");
        nh_config_free(&c);
    }
    json_decref(j);
    return 0;
}
