// sg_tool_grammar.c - the grammar of a forced tool call (tool_choice
// "required" or a named function): one call (or several, with parallel) in
// the format its parser reads, whose arguments satisfy the tool's parameter
// schema once that parser has read them.
//
//   hermes       <tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>
//                (calls separated by "\n")
//   llama3_json  {"name": "N", "parameters": ARGS}   (separated by "; ")
//   qwen3_coder  <tool_call>\n<function=N>\n then per parameter, in schema
//                order (optional ones may be left out)
//                <parameter=K>\nVALUE\n</parameter>\n
//                then </function>\n</tool_call>   (separated by "\n")
//
// ARGS is the JSON-schema grammar of the parameters. A qwen3_coder VALUE is
// what the parser turns into a valid value: a string parameter is raw text
// without "</parameter>", "<parameter=" or "</function>" (its enum, const,
// pattern, format or length as raw text, with no '<' under length limits);
// other types are their JSON text; a union is read by its first non-null
// branch (as the parser does), plus "null" when the union allows it.
#include "core/common.h"
#include "structured/sg_internal.h"

static const json_t *fn_of(const json_t *tool) {
    const json_t *fn = json_object_get(tool, "function");
    return fn ? fn : tool;
}

static const char *first_type(const json_t *s, int *nullable) {
    const json_t *t = json_object_get(s, "type");
    *nullable = 0;
    if (json_is_string(t)) return json_string_value(t);
    if (json_is_array(t)) {
        const char *first = NULL;
        size_t i;
        json_t *x;
        json_array_foreach(t, i, x) {
            const char *n = json_string_value(x);
            if (!n) continue;
            if (!strcmp(n, "null")) *nullable = 1;
            else if (!first) first = n;
        }
        return first;
    }
    return NULL;
}

// The raw-text value of a string parameter.
static int raw_string(struct sg_ir *ir, const json_t *s, struct sg_expr **out) {
    const json_t *e = json_object_get(s, "enum"), *c = json_object_get(s, "const");
    if (e || c) {
        struct sg_expr *alt = sg_alt(ir);
        json_t *one = c ? json_pack("[O]", c) : NULL;
        size_t i;
        json_t *x;
        json_array_foreach(c ? one : e, i, x) if (json_is_string(x)) sg_push(alt, sg_lits(ir, json_string_value(x)));
        json_decref(one);
        if (!alt->n) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "tool parameter: no string in enum / const");
        *out = alt;
        return VLLM_OK;
    }
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if (json_is_string(pat)) return sg_regex_expr(ir, json_string_value(pat), 0, out);
    if (json_is_string(fmt)) { // the format's pattern through the JSON-string front end: plain ASCII, as raw text
        json_t *only = json_pack("{s:s, s:O}", "type", "string", "format", fmt);
        struct sg_expr *q;
        int rc = sg_json_schema_expr(ir, only, &q);
        json_decref(only);
        TRY(rc);
        *out = q->kind == SG_E_SEQ && q->n == 3 ? q->sub[1] : q; // drop the quotes
        return VLLM_OK;
    }
    const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    if (mn || mx) {
        uint32_t lt[2] = {'<', '<'};
        int a = mn ? (int)json_number_value(mn) : 0, b = mx ? (int)json_number_value(mx) : -1;
        if (a < 0 || a > 2048 || (b >= 0 && b < a)) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "tool parameter: bad lengths");
        *out = sg_rep(ir, sg_class(ir, lt, 1, 1), a, b > 2048 ? 2048 : b);
        return VLLM_OK;
    }
    static const char *const STOP[] = {"</parameter>", "<parameter=", "</function>"};
    *out = sg_excl(ir, STOP, 3);
    return VLLM_OK;
}

static int coder_value(struct sg_ir *ir, const json_t *s, struct sg_expr **out) {
    int nullable = 0;
    const json_t *branch = s;
    const json_t *any = json_object_get(s, "anyOf");
    if (json_is_array(any)) { // read by its first non-null branch
        branch = NULL;
        size_t i;
        json_t *x;
        json_array_foreach(any, i, x) {
            const char *t = json_string_value(json_object_get(x, "type"));
            if (t && !strcmp(t, "null")) nullable = 1;
            else if (!branch) branch = x;
        }
        if (!branch) {
            *out = sg_lits(ir, "null");
            return VLLM_OK;
        }
    }
    int n2;
    const char *type = first_type(branch, &n2);
    nullable |= n2;
    struct sg_expr *e;
    if (!type || !strcmp(type, "string")) {
        TRY(raw_string(ir, branch, &e));
    } else {
        json_t *b = json_deep_copy(branch);
        json_object_set_new(b, "type", json_string(type));
        int rc = sg_json_schema_expr(ir, b, &e);
        json_decref(b);
        TRY(rc);
    }
    *out = nullable ? sg_altv(ir, e, sg_lits(ir, "null"), NULL) : e;
    return VLLM_OK;
}

static int coder_call(struct sg_ir *ir, const char *name, const json_t *params, struct sg_expr **out) {
    struct sg_buf head = {0};
    sg_buf_addf(&head, "<tool_call>\n<function=%s>\n", name);
    struct sg_expr *seq = sg_seqv(ir, sg_lits(ir, head.p), NULL);
    free(head.p);
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v) {
        struct sg_expr *val;
        int rc = coder_value(ir, v, &val);
        if (rc) return vllm_err_prefix(rc, "tool '%s' parameter '%s'", name, k);
        struct sg_buf p = {0};
        sg_buf_addf(&p, "<parameter=%s>\n", k);
        struct sg_expr *block = sg_seqv(ir, sg_lits(ir, p.p), val, sg_lits(ir, "\n</parameter>\n"), NULL);
        free(p.p);
        int required = 0;
        size_t i;
        json_t *r;
        json_array_foreach(req, i, r) required |= json_is_string(r) && !strcmp(json_string_value(r), k);
        sg_push(seq, required ? block : sg_opt(ir, block));
    }
    sg_push(seq, sg_lits(ir, "</function>\n</tool_call>"));
    *out = seq;
    return VLLM_OK;
}

static int json_call(struct sg_ir *ir, enum sg_tool_format f, const char *name, const json_t *params,
                     struct sg_expr **out) {
    struct sg_expr *args;
    int rc = sg_json_schema_expr(ir, params, &args);
    if (rc) return vllm_err_prefix(rc, "tool '%s'", name);
    json_t *nm = json_string(name);
    char *nj = json_dumps(nm, JSON_ENCODE_ANY);
    struct sg_buf head = {0};
    if (f == SG_TOOL_HERMES) sg_buf_addf(&head, "<tool_call>\n{\"name\": %s, \"arguments\": ", nj);
    else sg_buf_addf(&head, "{\"name\": %s, \"parameters\": ", nj);
    *out = sg_seqv(ir, sg_lits(ir, head.p), args, sg_lits(ir, f == SG_TOOL_HERMES ? "}\n</tool_call>" : "}"), NULL);
    free(head.p);
    free(nj);
    json_decref(nm);
    return VLLM_OK;
}

int sg_compile_tool_call(enum sg_tool_format f, const json_t *tools, const char *name, int parallel,
                         struct sg_grammar **out) {
    *out = NULL;
    if (!json_is_array(tools) || !json_array_size(tools))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "tool_choice: no tools given");
    struct sg_ir *ir = sg_ir_create();
    struct sg_expr *alt = sg_alt(ir);
    int rc = VLLM_OK;
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        const json_t *fn = fn_of(tool);
        const char *tn = json_string_value(json_object_get(fn, "name"));
        if (!tn) {
            rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT, "tools[%zu]: no function name", i);
            break;
        }
        if (name && strcmp(name, tn)) continue;
        json_t *params = json_object_get(fn, "parameters");
        json_t *empty = params ? NULL : json_pack("{s:s, s:{}}", "type", "object", "properties");
        struct sg_expr *call = NULL;
        rc = f == SG_TOOL_QWEN3_CODER ? coder_call(ir, tn, params ? params : empty, &call)
                                      : json_call(ir, f, tn, params ? params : empty, &call);
        json_decref(empty);
        if (rc) break;
        sg_push(alt, call);
    }
    if (!rc && !alt->n) rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT, "tool_choice: no tool named '%s'", name ? name : "");
    if (rc) {
        sg_ir_free(ir);
        return rc;
    }
    int one = sg_ir_rule(ir, "tool-call");
    sg_ir_define(ir, one, alt);
    struct sg_expr *body = sg_ref(ir, one);
    if (parallel)
        body = sg_seqv(ir, body, sg_rep(ir, sg_seqv(ir, sg_lits(ir, f == SG_TOOL_LLAMA3_JSON ? "; " : "\n"), sg_ref(ir, one), NULL), 0, -1), NULL);
    int root = sg_ir_rule(ir, "root");
    sg_ir_define(ir, root, body);
    rc = sg_grammar_build(ir, root, out);
    sg_ir_free(ir);
    return rc;
}
