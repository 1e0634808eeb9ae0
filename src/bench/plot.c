/* plot.c — SVG charts of benchmark results (plot.h). Reads the result JSON with jansson, then
 * writes plain SVG 1.1: axes with "nice" ticks (1, 2, 5 x 10^k), polylines, markers, text. */
#include "bench/plot.h"
#include "base/status.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXPTS 64

/* One run reduced to what the charts show. */
typedef struct {
    double conc;
    double ttft[3], tpot[3], e2el[3]; /* p50, p95, p99 in ms */
    double tput;                      /* output tokens/s */
    double inter;                     /* tokens/s/user */
} point;

typedef struct {
    char label[200];
    point p[MAXPTS];
    int n;
} seriesset;

static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
static const char *dashes[] = {"", "6,4", "2,3"};
static const char *pct_names[] = {"p50", "p95", "p99"};

static double num(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *str_or(json_t *v) { return json_string_value(v) ? json_string_value(v) : "?"; }

static int load(const char *path, seriesset *s, mk_err *err) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return mk_fail(err, MK_EIO, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    json_t *runs = json_object_get(root, "runs");
    if (!json_is_array(runs) || !json_array_size(runs)) {
        json_decref(root);
        return mk_fail(err, MK_EFORMAT, "%s: no \"runs\" array (not a minke bench result file?)", path);
    }
    memset(s, 0, sizeof *s);
    size_t i;
    json_t *run;
    json_array_foreach(runs, i, run) {
        if (s->n == MAXPTS) break;
        json_t *sum = json_object_get(run, "summary"), *cfg = json_object_get(run, "config");
        if (!s->label[0]) {
            const char *l = json_string_value(json_object_get(cfg, "label"));
            if (l && *l) snprintf(s->label, sizeof s->label, "%s", l);
            else
                snprintf(s->label, sizeof s->label, "%s @ %s", str_or(json_object_get(cfg, "model")),
                         str_or(json_object_get(cfg, "base_url")));
        }
        point *p = &s->p[s->n];
        p->conc = num(run, "concurrency");
        if (!(p->conc > 0)) p->conc = num(sum, "max_concurrent_requests");
        const char *st[3] = {"median", "p95", "p99"};
        char k[64];
        for (int j = 0; j < 3; j++) {
            snprintf(k, sizeof k, "%s_ttft_ms", st[j]);
            p->ttft[j] = num(sum, k);
            snprintf(k, sizeof k, "%s_tpot_ms", st[j]);
            p->tpot[j] = num(sum, k);
            snprintf(k, sizeof k, "%s_e2el_ms", st[j]);
            p->e2el[j] = num(sum, k);
        }
        p->tput = num(sum, "output_throughput");
        p->inter = num(sum, "interactivity");
        if (!(p->inter > 0) && p->tpot[0] > 0) p->inter = 1000.0 / p->tpot[0];
        if (p->conc > 0) s->n++;
    }
    json_decref(root);
    /* sort by concurrency */
    for (int a = 1; a < s->n; a++)
        for (int b = a; b > 0 && s->p[b].conc < s->p[b - 1].conc; b--) {
            point t = s->p[b];
            s->p[b] = s->p[b - 1];
            s->p[b - 1] = t;
        }
    return MK_OK;
}

/* ---- axes ---------------------------------------------------------------------------------- */

static double nice_step(double range, int target) {
    if (!(range > 0)) return 1;
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

typedef struct {
    double x, y, w, h;        /* plot area in px */
    double x0, x1, y0, y1;    /* data range */
    int xlog;
} frame;

static double px(const frame *fr, double x) {
    if (fr->xlog) return fr->x + (log2(x) - log2(fr->x0)) / (log2(fr->x1) - log2(fr->x0)) * fr->w;
    return fr->x + (x - fr->x0) / (fr->x1 - fr->x0) * fr->w;
}
static double py(const frame *fr, double y) { return fr->y + fr->h - (y - fr->y0) / (fr->y1 - fr->y0) * fr->h; }

static void esc(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

static void fmt_tick(char *b, size_t n, double v, double step) {
    if (step >= 1 || v == 0) snprintf(b, n, "%.0f", v);
    else snprintf(b, n, "%.*f", (int)ceil(-log10(step)), v);
}

/* Frame, grid, ticks and labels. xs: the x values present (ticks of a log axis). */
static void axes(FILE *f, frame *fr, const char *title, const char *xlabel, const char *ylabel, const double *xs,
                 int nxs) {
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"white\" stroke=\"#444\"/>\n", fr->x,
            fr->y, fr->w, fr->h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\" text-anchor=\"middle\">", fr->x + fr->w / 2,
            fr->y - 10);
    esc(f, title);
    fprintf(f, "</text>\n");
    /* y ticks */
    double ys = nice_step(fr->y1 - fr->y0, 5);
    for (double v = ceil(fr->y0 / ys) * ys; v <= fr->y1 + ys * 1e-9; v += ys) {
        double y = py(fr, v);
        char b[32];
        fmt_tick(b, sizeof b, v, ys);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", fr->x, y, fr->x + fr->w, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n", fr->x - 5, y + 4, b);
    }
    /* x ticks */
    if (fr->xlog) {
        for (int i = 0; i < nxs; i++) {
            if (i && xs[i] == xs[i - 1]) continue;
            double x = px(fr, xs[i]);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, fr->y, x, fr->y + fr->h);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n", x,
                    fr->y + fr->h + 15, xs[i]);
        }
    } else {
        double xst = nice_step(fr->x1 - fr->x0, 5);
        for (double v = ceil(fr->x0 / xst) * xst; v <= fr->x1 + xst * 1e-9; v += xst) {
            double x = px(fr, v);
            char b[32];
            fmt_tick(b, sizeof b, v, xst);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, fr->y, x, fr->y + fr->h);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", x,
                    fr->y + fr->h + 15, b);
        }
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">", fr->x + fr->w / 2, fr->y + fr->h + 32);
    esc(f, xlabel);
    fprintf(f, "</text>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 %.1f %.1f)\">",
            fr->x - 45, fr->y + fr->h / 2, fr->x - 45, fr->y + fr->h / 2);
    esc(f, ylabel);
    fprintf(f, "</text>\n");
}

/* Data ranges: y from 0 to max + 8%; x over the values, padded. */
static void fit_y(frame *fr, double ymax) {
    fr->y0 = 0;
    fr->y1 = ymax > 0 ? ymax * 1.08 : 1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fit_x(frame *fr, double *xs, int n, int allow_log) {
    qsort(xs, (size_t)n, sizeof(double), cmp_d);
    double lo = n ? xs[0] : 0, hi = n ? xs[n - 1] : 1;
    fr->xlog = allow_log && lo > 0 && hi / lo >= 4;
    if (fr->xlog) {
        fr->x0 = lo / 1.3;
        fr->x1 = hi * 1.3;
    } else {
        double pad = hi > lo ? (hi - lo) * 0.08 : (hi > 0 ? hi * 0.5 : 1);
        fr->x0 = lo - pad < 0 && lo >= 0 ? 0 : lo - pad;
        fr->x1 = hi + pad;
    }
}

static void marker(FILE *f, double x, double y, const char *c) {
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", x, y, c);
}

/* One latency panel: metric 0 = TTFT, 1 = TPOT, 2 = E2EL. */
static void latency_panel(FILE *f, double X, double Y, double W, double H, const seriesset *s, int ns, int metric) {
    static const char *titles[] = {"TTFT percentiles", "TPOT percentiles", "E2E latency percentiles"};
    frame fr = {X, Y, W, H, 0, 0, 0, 0, 0};
    double xs[MAXPTS * 8];
    int nx = 0;
    double ymax = 0;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            const point *p = &s[k].p[i];
            const double *v = metric == 0 ? p->ttft : metric == 1 ? p->tpot : p->e2el;
            if (nx < MAXPTS * 8) xs[nx++] = p->conc;
            for (int j = 0; j < 3; j++)
                if (isfinite(v[j]) && v[j] > ymax) ymax = v[j];
        }
    fit_x(&fr, xs, nx, 1);
    fit_y(&fr, ymax);
    axes(f, &fr, titles[metric], "concurrency (requests in flight / lanes)", "ms", xs, nx);
    for (int k = 0; k < ns; k++) {
        const char *c = colors[k % 8];
        for (int j = 0; j < 3; j++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s%s%s points=\"", c,
                    *dashes[j] ? " stroke-dasharray=\"" : "", dashes[j], *dashes[j] ? "\"" : "");
            for (int i = 0; i < s[k].n; i++) {
                const point *p = &s[k].p[i];
                double v = (metric == 0 ? p->ttft : metric == 1 ? p->tpot : p->e2el)[j];
                if (isfinite(v)) fprintf(f, "%.1f,%.1f ", px(&fr, p->conc), py(&fr, v));
            }
            fprintf(f, "\"/>\n");
            for (int i = 0; i < s[k].n; i++) {
                const point *p = &s[k].p[i];
                double v = (metric == 0 ? p->ttft : metric == 1 ? p->tpot : p->e2el)[j];
                if (isfinite(v)) marker(f, px(&fr, p->conc), py(&fr, v), c);
            }
        }
    }
}

static void pareto_panel(FILE *f, double X, double Y, double W, double H, const seriesset *s, int ns) {
    frame fr = {X, Y, W, H, 0, 0, 0, 0, 0};
    double xs[MAXPTS * 8];
    int nx = 0;
    double ymax = 0;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (isfinite(s[k].p[i].inter) && nx < MAXPTS * 8) xs[nx++] = s[k].p[i].inter;
            if (isfinite(s[k].p[i].tput) && s[k].p[i].tput > ymax) ymax = s[k].p[i].tput;
        }
    fit_x(&fr, xs, nx, 0);
    fit_y(&fr, ymax);
    axes(f, &fr, "Throughput vs interactivity (Pareto)", "interactivity: tokens/s/user (1 / P90 per-request ITL)",
         "output tokens/s", xs, nx);
    for (int k = 0; k < ns; k++) {
        const char *c = colors[k % 8];
        /* the sweep, in concurrency order, thin */
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1\" stroke-opacity=\"0.5\" points=\"", c);
        for (int i = 0; i < s[k].n; i++)
            if (isfinite(s[k].p[i].inter) && isfinite(s[k].p[i].tput))
                fprintf(f, "%.1f,%.1f ", px(&fr, s[k].p[i].inter), py(&fr, s[k].p[i].tput));
        fprintf(f, "\"/>\n");
        /* the frontier: points no other point beats on both axes, by interactivity */
        int idx[MAXPTS], m = 0;
        for (int i = 0; i < s[k].n; i++) {
            const point *p = &s[k].p[i];
            if (!isfinite(p->inter) || !isfinite(p->tput)) continue;
            int dominated = 0;
            for (int j = 0; j < s[k].n && !dominated; j++) {
                const point *q = &s[k].p[j];
                dominated = j != i && q->inter >= p->inter && q->tput >= p->tput && (q->inter > p->inter || q->tput > p->tput);
            }
            if (!dominated) idx[m++] = i;
        }
        for (int a = 1; a < m; a++)
            for (int b = a; b > 0 && s[k].p[idx[b]].inter < s[k].p[idx[b - 1]].inter; b--) {
                int t = idx[b];
                idx[b] = idx[b - 1];
                idx[b - 1] = t;
            }
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2.5\" points=\"", c);
        for (int a = 0; a < m; a++) fprintf(f, "%.1f,%.1f ", px(&fr, s[k].p[idx[a]].inter), py(&fr, s[k].p[idx[a]].tput));
        fprintf(f, "\"/>\n");
        for (int i = 0; i < s[k].n; i++) {
            const point *p = &s[k].p[i];
            if (!isfinite(p->inter) || !isfinite(p->tput)) continue;
            double x = px(&fr, p->inter), y = py(&fr, p->tput);
            marker(f, x, y, c);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\">c=%g</text>\n", x + 5, y - 5, c, p->conc);
        }
    }
}

int mk_bench_plot(const char *const *files, int n, const char *out, const char *title, mk_err *err) {
    if (n < 1) return mk_fail(err, MK_EINVAL, "no result file given");
    seriesset *s = calloc((size_t)n, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    int rc = MK_OK;
    for (int i = 0; i < n && !rc; i++) rc = load(files[i], &s[i], err);
    FILE *f = rc ? NULL : fopen(out, "w");
    if (!rc && !f) rc = mk_fail(err, MK_EIO, "cannot write %s", out);
    if (rc) {
        free(s);
        return rc;
    }
    const double W = 1100, PW = 440, PH = 270, LX = 90, RX = 90 + PW + 110;
    double top = 70 + 18.0 * n;
    double H = top + 2 * (PH + 90) + 10;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n", W, H, W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"28\" font-size=\"18\" font-weight=\"bold\" text-anchor=\"middle\">", W / 2);
    esc(f, title ? title : "minke bench");
    fprintf(f, "</text>\n");
    /* legend: one colour per file, one dash per percentile */
    for (int k = 0; k < n; k++) {
        double y = 52 + 18.0 * k;
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n", LX, y - 4,
                LX + 24, y - 4, colors[k % 8]);
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\">", LX + 30, y);
        esc(f, s[k].label);
        fprintf(f, " (%d run%s)</text>\n", s[k].n, s[k].n == 1 ? "" : "s");
    }
    for (int j = 0; j < 3; j++) {
        double x = RX + 160 + 90.0 * j;
        fprintf(f, "<line x1=\"%.0f\" y1=\"48\" x2=\"%.0f\" y2=\"48\" stroke=\"#333\" stroke-width=\"2\"%s%s%s/>\n", x,
                x + 30, *dashes[j] ? " stroke-dasharray=\"" : "", dashes[j], *dashes[j] ? "\"" : "");
        fprintf(f, "<text x=\"%.0f\" y=\"52\" font-size=\"12\">%s</text>\n", x + 36, pct_names[j]);
    }
    latency_panel(f, LX, top + 20, PW, PH, s, n, 0);
    latency_panel(f, RX, top + 20, PW, PH, s, n, 1);
    latency_panel(f, LX, top + 20 + PH + 90, PW, PH, s, n, 2);
    pareto_panel(f, RX, top + 20 + PH + 90, PW, PH, s, n);
    fprintf(f, "</svg>\n");
    if (fclose(f)) rc = mk_fail(err, MK_EIO, "cannot write %s", out);
    free(s);
    return rc;
}
