// count_records: the number of live records of the input collection, the logic of the
// built-in `record_counter` written as a component.
//
// An attached Sluice function (docs/functions.md) in C, built like project_keys.c. It takes
// no params (`{}`). It reads no stored field: an insert (`before` none, `after` present)
// adds 1 to the counter behind output record `function_output`, a removal subtracts 1, a
// merge emits nothing; the count is kept at zero (`remove-at-zero` false). Its outputs equal
// `record_counter`'s, delta for delta, which is what makes it the benchmark's measure of
// what the component boundary costs (scripts/bench-wasm.sh): same work on both sides.
//
// No allocation per change on the guest's side beyond the change the host hands in: the
// one delta returned lives in static memory, pointing at static strings, and this file
// defines the post-return function of `deltas` (the bindings' own is a weak symbol that
// frees the returned list) so that nothing static is freed.

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "function.h"

static bool initialized = false;
static exports_sluice_function_guest_output_delta_t delta;

static bool only_space(const function_string_t *s, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) {
        uint8_t ch = s->ptr[i];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') return false;
    }
    return true;
}

// `{}` with any white space: record_counter takes no parameters either.
static bool no_params(const function_string_t *params) {
    size_t open = 0;
    while (open < params->len && only_space(params, open, open + 1)) open++;
    if (open == params->len || params->ptr[open] != '{') return false;
    size_t close = open + 1;
    while (close < params->len && only_space(params, close, close + 1)) close++;
    return close < params->len && params->ptr[close] == '}' && only_space(params, close + 1, params->len);
}

bool exports_sluice_function_guest_init(function_string_t *params, function_string_t *err) {
    bool ok = no_params(params);
    function_string_free(params);
    if (!ok) {
        function_string_dup(err, "count_records takes no parameters: give {} or leave --params out");
        return false;
    }
    function_string_set(&delta.val.count.output_id, "function_output");
    function_string_set(&delta.val.count.count_field, "total_count");
    delta.tag = SLUICE_FUNCTION_TYPES_OUTPUT_DELTA_COUNT;
    delta.val.count.fields.ptr = NULL;
    delta.val.count.fields.len = 0;
    delta.val.count.remove_at_zero = false;
    initialized = true;
    return true;
}

exports_sluice_function_guest_stored_fields_t exports_sluice_function_guest_reads(void) {
    return 0; // whether the record exists is all a count needs
}

bool exports_sluice_function_guest_deltas(exports_sluice_function_guest_change_t *change,
                                          exports_sluice_function_guest_list_output_delta_t *ret,
                                          function_string_t *err) {
    bool before = change->before.is_some, after = change->after.is_some;
    exports_sluice_function_guest_change_free(change);
    if (!initialized) {
        function_string_set(err, "count_records: deltas called before init");
        return false;
    }
    ret->ptr = NULL;
    ret->len = 0;
    if (before == after) return true; // a merge keeps the record live: nothing to count
    delta.val.count.delta = after ? 1 : -1;
    ret->ptr = &delta;
    ret->len = 1;
    return true;
}

// The post-return of `deltas`: what `deltas` returned is static (the delta, its strings,
// the error text), so there is nothing to free.
__attribute__((__export_name__("cabi_post_sluice:function/guest@1.0.0#deltas")))
void __wasm_export_exports_sluice_function_guest_deltas_post_return(uint8_t *arg0) {
    (void)arg0;
}
