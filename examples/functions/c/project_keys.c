// project_keys: a copy of each live record with only some of its metadata keys.
//
// An attached Sluice function (docs/functions.md) in C, built with clang's wasm32-wasi
// target and wasi-libc (malloc and string functions only, which import nothing), on the
// bindings wit-bindgen made of schemas/function.wit (bindings/). Params:
// {"keep": ["genre", "year"]}.
//
// Every live input record has one output record with the same id whose metadata is the
// kept keys the record holds (none: empty metadata), without embedding or document. A
// change whose `after` is present emits a versioned put carrying the change's offset as its
// version; a delete emits a versioned remove at the change's offset (as the built-in
// `normalize` does), so a backfill never overwrites a newer live value or brings back a
// deleted record. Reads only the metadata.
//
// Memory: the bindings hand `init` and `deltas` their arguments to own (freed here) and
// free what they return after the host has copied it (the post-return functions), so an
// instance's memory does not grow with the number of changes.

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "function.h"

// The kept keys, parsed by init.
static function_string_t *keep = NULL;
static size_t keep_len = 0;
static bool initialized = false;

static void *xmalloc(size_t size) {
    void *p = malloc(size);
    if (p == NULL) {
        __builtin_trap(); // out of the instance's memory: the host marks the function failed
    }
    return p;
}

static bool fail(function_string_t *err, const char *message) {
    function_string_dup(err, message);
    return false;
}

// ---------------------------------------------------------------------------------------
// The params: a JSON object with one member, "keep", an array of non-empty strings.

typedef struct {
    const uint8_t *at;
    const uint8_t *end;
} cursor_t;

static void skip_space(cursor_t *c) {
    while (c->at < c->end && (*c->at == ' ' || *c->at == '\t' || *c->at == '\n' || *c->at == '\r')) {
        c->at++;
    }
}

static bool take(cursor_t *c, uint8_t ch) {
    skip_space(c);
    if (c->at < c->end && *c->at == ch) {
        c->at++;
        return true;
    }
    return false;
}

static int hex_digit(uint8_t ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static bool read_hex4(cursor_t *c, uint32_t *out) {
    if (c->end - c->at < 4) return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(c->at[i]);
        if (d < 0) return false;
        v = v * 16 + (uint32_t)d;
    }
    c->at += 4;
    *out = v;
    return true;
}

static size_t put_utf8(uint8_t *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

// A JSON string at the cursor, unescaped into a new UTF-8 string. The decoded text is
// never longer than the escaped one, so one buffer of the remaining length is enough.
static bool read_string(cursor_t *c, function_string_t *out) {
    if (!take(c, '"')) return false;
    uint8_t *buf = xmalloc((size_t)(c->end - c->at) + 1);
    size_t n = 0;
    while (c->at < c->end && *c->at != '"') {
        uint8_t ch = *c->at++;
        if (ch < 0x20) goto bad;
        if (ch != '\\') {
            buf[n++] = ch;
            continue;
        }
        if (c->at >= c->end) goto bad;
        uint8_t esc = *c->at++;
        uint32_t cp;
        switch (esc) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u':
            if (!read_hex4(c, &cp)) goto bad;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t low;
                if (c->end - c->at < 2 || c->at[0] != '\\' || c->at[1] != 'u') goto bad;
                c->at += 2;
                if (!read_hex4(c, &low) || low < 0xDC00 || low > 0xDFFF) goto bad;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                goto bad;
            }
            n += put_utf8(buf + n, cp);
            break;
        default:
            goto bad;
        }
    }
    if (c->at >= c->end) goto bad;
    c->at++; // the closing quote
    out->ptr = buf;
    out->len = n;
    return true;
bad:
    free(buf);
    return false;
}

static bool same(const function_string_t *a, const function_string_t *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->ptr, b->ptr, a->len) == 0);
}

static bool is_kept(const function_string_t *key) {
    for (size_t i = 0; i < keep_len; i++) {
        if (same(&keep[i], key)) return true;
    }
    return false;
}

static void free_keep(void) {
    for (size_t i = 0; i < keep_len; i++) {
        function_string_free(&keep[i]);
    }
    free(keep);
    keep = NULL;
    keep_len = 0;
}

static const char *parse_keep(cursor_t *c) {
    size_t cap = 4;
    keep = xmalloc(cap * sizeof *keep);
    keep_len = 0;
    if (!take(c, '[')) return "parameter \"keep\" must be an array of metadata keys";
    if (take(c, ']')) return NULL;
    do {
        function_string_t key;
        if (!read_string(c, &key)) return "parameter \"keep\" must be an array of strings";
        if (key.len == 0) {
            function_string_free(&key);
            return "parameter \"keep\" holds an empty key";
        }
        if (keep_len == cap) {
            cap *= 2;
            function_string_t *grown = realloc(keep, cap * sizeof *keep);
            if (grown == NULL) __builtin_trap();
            keep = grown;
        }
        keep[keep_len++] = key;
    } while (take(c, ','));
    if (!take(c, ']')) return "parameter \"keep\": expected ',' or ']'";
    return NULL;
}

// NULL when the params are good, else the reason.
static const char *parse_params(const function_string_t *params) {
    cursor_t c = {params->ptr, params->ptr + params->len};
    bool seen_keep = false;
    if (!take(&c, '{')) return "params must be a JSON object like {\"keep\": [\"genre\", \"year\"]}";
    if (!take(&c, '}')) {
        do {
            function_string_t name;
            if (!read_string(&c, &name)) return "params: expected a member name";
            static const function_string_t KEEP = {(uint8_t *)"keep", 4};
            bool is_keep = same(&name, &KEEP);
            function_string_free(&name);
            if (!is_keep) return "unknown parameter: project_keys takes only \"keep\"";
            if (seen_keep) return "parameter \"keep\" given twice";
            seen_keep = true;
            if (!take(&c, ':')) return "params: expected ':'";
            const char *problem = parse_keep(&c);
            if (problem != NULL) return problem;
        } while (take(&c, ','));
        if (!take(&c, '}')) return "params: expected ',' or '}'";
    }
    skip_space(&c);
    if (c.at != c.end) return "params: text after the JSON object";
    if (!seen_keep) return "parameter \"keep\" is missing: {\"keep\": [\"genre\", \"year\"]}";
    return NULL;
}

// ---------------------------------------------------------------------------------------
// The guest

bool exports_sluice_function_guest_init(function_string_t *params, function_string_t *err) {
    free_keep();
    const char *problem = parse_params(params);
    function_string_free(params);
    if (problem != NULL) {
        free_keep();
        return fail(err, problem);
    }
    initialized = true;
    return true;
}

exports_sluice_function_guest_stored_fields_t exports_sluice_function_guest_reads(void) {
    return SLUICE_FUNCTION_TYPES_STORED_FIELDS_METADATA;
}

static void copy_value(sluice_function_types_meta_value_t *to, const sluice_function_types_meta_value_t *from) {
    *to = *from;
    if (from->tag == SLUICE_FUNCTION_TYPES_META_VALUE_STR) {
        function_string_dup_n(&to->val.str, (const char *)from->val.str.ptr, from->val.str.len);
    }
}

bool exports_sluice_function_guest_deltas(exports_sluice_function_guest_change_t *change,
                                          exports_sluice_function_guest_list_output_delta_t *ret,
                                          function_string_t *err) {
    if (!initialized) {
        exports_sluice_function_guest_change_free(change);
        return fail(err, "project_keys: deltas called before init");
    }
    exports_sluice_function_guest_output_delta_t *delta = xmalloc(sizeof *delta);
    if (change->after.is_some) {
        const sluice_function_types_list_meta_entry_t *metadata = &change->after.val.metadata;
        size_t n = 0;
        for (size_t i = 0; i < metadata->len; i++) {
            n += is_kept(&metadata->ptr[i].key);
        }
        // The record's entries are sorted by key, so the kept ones are too.
        sluice_function_types_meta_entry_t *entries = n ? xmalloc(n * sizeof *entries) : NULL;
        size_t j = 0;
        for (size_t i = 0; i < metadata->len; i++) {
            const sluice_function_types_meta_entry_t *entry = &metadata->ptr[i];
            if (!is_kept(&entry->key)) continue;
            function_string_dup_n(&entries[j].key, (const char *)entry->key.ptr, entry->key.len);
            copy_value(&entries[j].value, &entry->value);
            j++;
        }
        delta->tag = SLUICE_FUNCTION_TYPES_OUTPUT_DELTA_PUT;
        sluice_function_types_stored_record_t *put = &delta->val.put;
        function_string_dup_n(&put->id, (const char *)change->id.ptr, change->id.len);
        put->embedding.is_some = false;
        put->metadata.ptr = entries;
        put->metadata.len = n;
        put->document.is_some = false;
        put->offset = change->offset; // the version: the change's offset
    } else {
        delta->tag = SLUICE_FUNCTION_TYPES_OUTPUT_DELTA_REMOVE;
        function_string_dup_n(&delta->val.remove.id, (const char *)change->id.ptr, change->id.len);
        delta->val.remove.offset = change->offset;
    }
    ret->ptr = delta;
    ret->len = 1;
    exports_sluice_function_guest_change_free(change);
    return true;
}
