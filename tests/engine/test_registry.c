// test_registry.c - the model registry against the fixture lists the gates
// run over: every fixture's architecture resolves to a family, every family
// of the registry has at least one fixture, and every alias finds its family.
#include "core/common.h"
#include "core/json.h"
#include "models/model.h"
#include "test.h"
#include "util.h"

int main(void) {
    int nf, nx;
    const struct model_family *fam = model_families(&nf);
    char **fx;
    nx = tu_fixture_list("VLLM_GATE_FIXTURES", &fx);
    CHECKF(nf > 0 && nx > 0, "%d families, %d fixtures", nf, nx);
    int *covered = xcalloc(nf, sizeof(int));
    for (int i = 0; i < nx; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "%s/config.json", fx[i]);
        char *path = tu_fixture(rel);
        json_t *cfg = NULL;
        CHECKF(json_load_path(path, &cfg) == 0, "%s: %s", path, vllm_last_error());
        const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
        const struct model_family *f = arch ? model_find(arch) : NULL;
        CHECKF(f != NULL, "fixture %s: architecture %s is not in the registry", fx[i], arch ? arch : "(none)");
        if (f) covered[f - fam]++;
        json_decref(cfg);
        free(path);
    }
    for (int k = 0; k < nf; k++) {
        CHECKF(covered[k] > 0, "registry family %s has no oracle fixture in the gate lists", fam[k].name);
        for (const char *const *a = fam[k].archs; *a; a++)
            CHECKF(model_find(*a) == &fam[k] && model_arch_name(*a) == *a, "alias %s", *a);
        printf("family %-12s %d fixture(s)\n", fam[k].name, covered[k]);
    }
    CHECK(model_find("NoSuchForCausalLM") == NULL);
    free(covered);
    tu_list_free(fx, nx);
    return test_summary("registry");
}
