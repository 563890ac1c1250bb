// test_json.c - Python-flavoured JSON: bare Infinity/NaN, "Infinity" strings,
// transformers 5's {"__float__": "Infinity"}, and errors naming the key.
#include <math.h>

#include "core/common.h"
#include "core/json.h"
#include "test.h"

int main(void) {
    const char *txt = "{\"a\": Infinity, \"b\": -Infinity, \"c\": NaN, \"d\": \"Infinity\","
                      " \"e\": {\"__float__\": \"Infinity\"}, \"f\": [0.0, {\"__float__\": \"-Infinity\"}],"
                      " \"s\": \"text with Infinity and NaN inside\", \"n\": 3}";
    json_t *j = NULL;
    CHECK(json_parse_python(txt, strlen(txt), "t", &j) == 0);
    double v;
    CHECK(json_req_double(j, "a", "t", &v) == 0 && isinf(v) && v > 0);
    CHECK(json_req_double(j, "b", "t", &v) == 0 && isinf(v) && v < 0);
    CHECK(json_req_double(j, "c", "t", &v) == 0 && isnan(v));
    CHECK(json_req_double(j, "d", "t", &v) == 0 && isinf(v) && v > 0);
    CHECK(json_req_double(j, "e", "t", &v) == 0 && isinf(v) && v > 0);
    CHECK(json_as_double(json_array_get(json_object_get(j, "f"), 1), &v) == 0 && isinf(v) && v < 0);
    CHECK(!strcmp(json_string_value(json_object_get(j, "s")), "text with Infinity and NaN inside"));
    int64_t n;
    CHECK(json_req_int(j, "n", "t", &n) == 0 && n == 3);
    CHECK(json_req_int(j, "missing", "cfg.json", &n) == VLLM_ERR_FORMAT);
    CHECK(strstr(vllm_last_error(), "missing") && strstr(vllm_last_error(), "cfg.json"));
    json_decref(j);
    const char *big = "{\"model_max_length\": 1000000000000000019884624838656, \"n\": -12, \"x\": 1.5e3}";
    CHECK(json_parse_python(big, strlen(big), "big", &j) == 0);
    CHECK(j && json_req_double(j, "model_max_length", "big", &v) == 0 && v > 9.9e29 && v < 1.1e30);
    CHECK(j && json_req_int(j, "n", "big", &n) == 0 && n == -12 && json_req_double(j, "x", "big", &v) == 0 && v == 1500);
    json_decref(j);
    CHECK(json_parse_python("{\"a\": ", 6, "broken.json", &j) == VLLM_ERR_FORMAT);
    CHECK(strstr(vllm_last_error(), "broken.json"));
    return test_summary("json");
}
