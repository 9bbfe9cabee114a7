/* link_smoke.c -- built by bindings/c/test.sh through pkg-config, once against the shared and
 * once against the static library, to prove the installed files are enough to link a host. */
#include <stdio.h>
#include <string.h>

#include <leasehold.h>

int main(void) {
    lh_config cfg;
    lh_backend_options backend;
    lh_client *c = NULL;
    const uint8_t seed[32] = {42};
    lh_config_default(&cfg);
    if (lh_backend_options_default(LH_BACKEND_SQLITE, &backend) != LH_OK) return 1;
    if (lh_client_new(&cfg, &backend, seed, sizeof seed, &c) != LH_OK) return 1;
    lh_client_free(c);
    if (strcmp(lh_version(), LH_VERSION) != 0 || lh_abi_version() != LH_ABI_VERSION) return 1;
    printf("link_smoke: leasehold %s ABI %u ok\n", lh_version(), lh_abi_version());
    return 0;
}
